// Token log-probabilities and entropies from logits, and their backward: the loss head of training.
//
// Why: true on-policy RL needs the trainer's log p(token) to be the very bits the sampler reported
// as raw_logprob. Both come from kernels::log_softmax_row over the same logits row, so they agree
// exactly.
#pragma once

#include <cstdint>

namespace miles {

// For each row r of logits [rows, vocab]: logp[r] = log_softmax(logits[r])[targets[r]] and, when
// entropy is not null, entropy[r] = −Σ_v p_v log p_v (chunked fixed-order sum).
void token_logprobs(const float* logits, int64_t rows, int64_t vocab, const int32_t* targets,
                    float* logp, float* entropy);

// d logits[r] = dlogp[r] · (onehot(target) − p) + dentropy[r] · (−p ⊙ (log p + H)).
// dentropy may be null (no entropy term). Rows whose coefficients are both 0 get zeros.
void token_logprobs_backward(const float* logits, int64_t rows, int64_t vocab,
                             const int32_t* targets, const float* dlogp, const float* dentropy,
                             float* dlogits);

}  // namespace miles
