// Fully unrolled fixed-size loops, so that per-lane or per-row accumulator arrays live in
// registers (a loop over the lanes keeps them on the stack: a store and a reload in every step of
// every chain). The order of each chain's operations is unchanged.
#pragma once

#define MILES_UNROLL _Pragma("GCC unroll 16")
