// Token log-probabilities and entropies from logits, and their backward: the loss head of training.
//
// Why: true on-policy RL needs the trainer's log p(token) to be the very bits the sampler reported
// as raw_logprob. Both come from kernels::log_softmax_row over the same logits row, so they agree
// exactly.
#pragma once

#include <cstdint>

#include "miles/kernels.h"
#include "miles/status.h"

namespace miles {

class Communicator;

// For each row r of logits [rows, vocab]: logp[r] = log_softmax(logits[r])[targets[r]] and, when
// entropy is not null, entropy[r] = −Σ_v p_v log p_v (chunked fixed-order sum).
// With `stats` (rows of them), each row's log-softmax normaliser is kept for the backward.
void token_logprobs(const float* logits, int64_t rows, int64_t vocab, const int32_t* targets,
                    float* logp, float* entropy, kernels::LogSoftmaxStats* stats = nullptr);

// d logits[r] = dlogp[r] · (onehot(target) − p) + dentropy[r] · (−p ⊙ (log p + H)).
// dentropy may be null (no entropy term). Rows whose coefficients are both 0 get zeros. dlogits
// may be logits itself (each row is read whole before it is written). `stats`, when given, are
// token_logprobs' for these rows of these logits (not recomputed; the same bits).
void token_logprobs_backward(const float* logits, int64_t rows, int64_t vocab,
                             const int32_t* targets, const float* dlogp, const float* dentropy,
                             float* dlogits, const kernels::LogSoftmaxStats* stats = nullptr);

// Vocabulary-parallel versions: each rank of `comm` holds logits [rows, vocab_local] for the
// vocabulary ids [vocab_begin, vocab_begin + vocab_local). The same formulas, with the row max
// combined exactly and the sums of exponentials / entropy terms combined in tree order over ranks:
// when vocab_local is a multiple of 128 and the group a power of two, the results are the
// single-process bits. Every rank gets every row's logp and entropy.
Status token_logprobs_vocab_parallel(const float* logits, int64_t rows, int64_t vocab_local,
                                     int64_t vocab_begin, const int32_t* targets,
                                     Communicator& comm, float* logp, float* entropy);
Status token_logprobs_backward_vocab_parallel(const float* logits, int64_t rows,
                                              int64_t vocab_local, int64_t vocab_begin,
                                              const int32_t* targets, Communicator& comm,
                                              const float* dlogp, const float* dentropy,
                                              float* dlogits);

}  // namespace miles
