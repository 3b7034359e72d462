// The constants of miles' exp (exp.h: Cody–Waite reduction and Cephes' polynomial), shared with the
// device kernels' copy of the function (src/device/device_math.h). Plain constants, no includes, so
// that nvcc's device pass can read them.
#pragma once

namespace miles::kernels::detail {

namespace exp_constants {
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kC1 = 0.693359375f;  // ln 2 = C1 + C2; C1 has 11 significant bits
inline constexpr float kC2 = -2.12194440e-4f;
inline constexpr float kP0 = 5.0000001201e-1f;  // P(r) = P0 + P1 r + ... + P5 r^5
inline constexpr float kP1 = 1.6666665459e-1f;
inline constexpr float kP2 = 4.1665795894e-2f;
inline constexpr float kP3 = 8.3334519073e-3f;
inline constexpr float kP4 = 1.3981999507e-3f;
inline constexpr float kP5 = 1.9875691500e-4f;
inline constexpr float kLo = -104.0f;  // below: 0 (exp(-104) < the smallest subnormal / 2)
inline constexpr float kHi = 89.0f;    // above: +inf (exp(89) > FLT_MAX)
}  // namespace exp_constants

}  // namespace miles::kernels::detail
