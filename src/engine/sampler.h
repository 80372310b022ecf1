/*
 * sampler - turns one row of logits into the next token, with vLLM's sampling semantics.
 *
 * A sampler belongs to one sequence: it holds that sequence's parameters, its seeded rng
 * and its token history (which tokens the prompt contains, how often each was generated).
 * The caller feeds the history with sampler_accept (prompt tokens with is_prompt = true,
 * then each token it decides to keep); sampler_sample does NOT record the token it returns,
 * so speculative decoding can reject it.
 *
 * Order of operations (vLLM's, on a private copy; the caller's logits are never modified):
 *   0. the caller's edits (sampler_edits: logit_bias, tokens banned before min_tokens)
 *   1. repetition penalty r over tokens seen in prompt or output: l > 0 ? l / r : l * r
 *   2. frequency and presence penalties over generated tokens only:
 *        l -= count * frequency_penalty + (count > 0) * presence_penalty
 *   3. temperature < 1e-5: greedy, argmax with the lowest index on ties (top-k/p/min-p
 *      ignored); else l /= temperature
 *   4. top-k: keep the k largest (ties broken by lower index; exactly k survive), in that
 *      order (largest first) for everything below
 *   5. top-p: over what top-k kept, keep the smallest most-probable prefix whose mass is
 *      >= top_p (always at least one token)
 *   6. min-p: drop tokens whose probability is below min_p * (largest probability)
 *   7. draw from the renormalized survivors with the sampler's xoshiro rng
 * The same parameters, seed, history and logits always give the same token.
 *
 * The first pass (sampler_sample_ex with a struct logits_top): greedy and top-k sampling
 * with k <= LOGITS_TOP_K need only the row's best tokens after edits and penalties. The
 * backend hands over each row's LOGITS_TOP_K largest raw logits, found by the LM head
 * while it wrote them (exec/logits_top.h); the sampler rescores the tokens that edits or
 * penalties change (from the row) and keeps the rest of top as it is, which is exact
 * whenever top holds k unchanged tokens. It then costs O(k + edits + history) instead of
 * a copy and a selection over n_vocab (a 128k vocabulary: ~0.5 ms a token), and gives the
 * very token the full pass would, which it falls back to whenever it cannot be sure
 * (a NaN in the row, too few unchanged candidates, ...). Top-p without top-k takes the
 * total weight from the row's chunk statistics (below: the LM head's, when the caller
 * asked for them at this temperature, else computed over the edited row) and, without
 * edits or penalties, the top-p prefix from the candidates when it ends within them: no
 * pass over the row at all (peaked rows). Min-p alone takes its survivors from the
 * candidates when the last of them falls below the cut (every survivor is then one).
 *
 * The temperature path (a temperature, no top-k, top-p or min-p: the OpenAI API's
 * default): steps 3-7 run on the row's weights by chunks of LOGITS_CHUNK ids, each with
 * its max m_c and sum s_c of attn_exp((l - m_c) / T) (the kernels' softmax statistics,
 * kernels/cpu/attn.h). The draw picks a chunk by the running sum of the chunk weights
 * s_c * attn_exp((m_c - max) / T) (in double), then the token within it by its weights.
 * The statistics come from the LM head when the caller asked the step for them at this
 * temperature (logits_top.inv_t = sampler_stats_inv_t(...)); the sampler recomputes only
 * the chunks holding tokens that edits or penalties change. Without them it computes
 * every chunk itself, with the same kernel on the same values: the same token either way,
 * for ~n_vocab / 256 chunk sums and one chunk's weights instead of a copy and two passes
 * over the row.
 *
 * Logprobs (sampler_top_logprobs, sampler_logprob) are of the raw logits row, log_softmax
 * with no penalty or temperature applied, which is what vLLM reports by default. The
 * normalizer comes from chunk statistics at inv_t 1 (sampler_log_sum_exp), the LM head's
 * when the caller asked for them, and the top tokens from the first pass's candidates.
 */
#ifndef WELD_ENGINE_SAMPLER_H
#define WELD_ENGINE_SAMPLER_H

#include "core/err.h"
#include "exec/logits_top.h"

#include <stdbool.h>
#include <stdint.h>

struct sampler_params {
    float temperature;        /* >= 0; < 1e-5 means greedy */
    int top_k;                /* <= 0 or >= n_vocab: off */
    float top_p;              /* (0, 1]; 1: off */
    float min_p;              /* [0, 1]; 0: off */
    float repetition_penalty; /* > 0; 1: off; prompt and generated tokens */
    float frequency_penalty;  /* 0: off; generated tokens only */
    float presence_penalty;   /* 0: off; generated tokens only */
    uint64_t seed;
};

struct sampler;

/* temperature 1, every filter and penalty off, seed 0. */
struct sampler_params sampler_params_default(void);
/* WELD_ERR_INVALID_ARG naming the field when a value is out of its range. */
int sampler_params_check(const struct sampler_params *p, struct weld_err *e);

int sampler_create(struct sampler **out, const struct sampler_params *p, int n_vocab,
                   struct weld_err *e);
void sampler_free(struct sampler *s);
/* Forget the history and reseed the rng from params.seed (a fresh request). */
void sampler_reset(struct sampler *s);
/* Record a prompt token (is_prompt) or a generated one. WELD_ERR_INVALID_ARG if token is
   outside [0, n_vocab); WELD_ERR_NOMEM if the history cannot grow. */
int sampler_accept(struct sampler *s, int token, bool is_prompt);

/* Pick the next token from logits (n_vocab floats). Errors: a NaN logit, a +inf logit
   (outside greedy), or every logit -inf (outside greedy). */
int sampler_sample(struct sampler *s, const float *logits, int *token, struct weld_err *e);
/* What a request changes in a raw logits row before sampling: token ids[k]'s logit becomes
   vals[k] (each id once, in [0, n_vocab); -INFINITY bans a token); then, with allow (a
   constraint's token mask, (n_vocab + 31) / 32 words; NULL: none), every token whose bit
   is clear gets -INFINITY. The caller makes sure some allowed token is finite. */
struct sampler_edits {
    const int32_t *ids;
    const float *vals;
    int n;
    const uint32_t *allow;
};

/* sampler_sample on logits with edits ed applied (NULL: none), taking the best tokens from
   top (the row's raw LOGITS_TOP_K largest; NULL: none) instead of a pass over the row when
   that is exact (see above). The token and errors are those of sampler_sample on the
   edited row. */
int sampler_sample_ex(struct sampler *s, const float *logits, const struct logits_top *top,
                      const struct sampler_edits *ed, int *token, struct weld_err *e);
/* Tokens this sampler drew from a logits_top without a pass over the row (since create). */
long long sampler_top_hits(const struct sampler *s);
/* 1 / temperature when sampling with p takes the temperature path or top-p without top-k
   (see above): the softmax statistics a caller should ask the step for
   (logits_top.inv_t); else 0. */
float sampler_stats_inv_t(const struct sampler_params *p, int n_vocab);
/* Draws that took a logits_top's softmax statistics (temperature and top-p paths). */
long long sampler_stats_hits(const struct sampler *s);
/* The distribution sampler_sample draws from, after every step above: probs gets n_vocab
   values summing to 1, zero for filtered tokens (one-hot for greedy). */
int sampler_probs(struct sampler *s, const float *logits, float *probs, struct weld_err *e);

/* The n most probable tokens of a raw logits row, most probable first (lower index first on
   ties), with their log-probabilities. Returns how many were written: min(n, n_vocab). */
int sampler_top_logprobs(const float *logits, int n_vocab, int n, int32_t *ids,
                         float *logprobs);
/* log_softmax(logits)[token]. */
float sampler_logprob(const float *logits, int n_vocab, int token);
/* log(sum exp(logits)), by LOGITS_CHUNK chunks of softmax statistics: top's when it has
   them at inv_t 1 (the LM head's), else computed here with the same kernel (the same
   value either way). */
double sampler_log_sum_exp(const float *logits, int n_vocab, const struct logits_top *top);
/* sampler_top_logprobs with the row's log_sum_exp lse given, taking the n best from top
   (NULL: none) when it holds them. */
int sampler_top_logprobs_ex(const float *logits, int n_vocab, int n,
                            const struct logits_top *top, double lse, int32_t *ids,
                            float *logprobs);

#endif
