// `miles bench kernels`: a training step's GEMMs at SmolLM2-135M's shapes, as % of the FMA peak.
#pragma once

namespace miles::cli {

// One micro-batch of 255 tokens through each of SmolLM2-135M's matrices (fused q/k/v, o, fused
// gate/up, down, the LM head): forward y = x·Wᵀ, d-input dx = dy·W (through W's transposed pack)
// and weight gradient dW = dyᵀ·x folded in place into a gradient buffer that is cold in cache, as
// the trainer folds its micro-batches. Prints each against peak_gflops (measured at the run's
// start) and against an FMA loop alternated with it (the peak beside it: a clock that drifts moves
// both, noise in the loads only the GEMM), and the step's GEMM time they add up to (4
// micro-batches, 30 layers).
void bench_train_gemm_shapes(int threads, double peak_gflops, double min_seconds);

// A decode step's GEMMs with a few rows: every matrix of SmolLM2-135M (30 layers, the LM head;
// 538 MB, so each comes from memory as in the engine) at M = 1 .. 64 rows, y = x·Wᵀ. M rows is a
// decode step of M samples, or a verify of M − 1 drafts (or a batch's verify chunks): the time
// against M = 1 is what it costs against a plain step; each also against a plain read of the same
// bytes on the same pool (the memory's limit), measured in the same run, and as % of peak_gflops
// (the FMA peak: where the rows make it compute-bound).
void bench_decode_gemm_rows(int threads, double peak_gflops, double min_seconds);

}  // namespace miles::cli
