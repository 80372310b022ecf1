/*
 * spec - speculative decoding's proposers: who guesses the next tokens a sequence will
 * take, so the engine can verify several in one step.
 *
 * A proposer is a struct spec_proposer: a propose function over a sequence's tokens so far
 * (prompt then output) giving up to max_k guesses, and a free. The engine asks it before a
 * step for each decoding sequence, plans the guesses as one multi-token entry
 * (engine/sched.h sched_set_draft), samples every row in order and keeps the guesses that
 * equal what it sampled (the first one that does not is replaced by the sampled token).
 * Each token is still drawn from the target model's own distribution given the true
 * prefix, with one sampler draw per token, so speculation changes nothing in the output:
 * greedy or sampled, seeded runs give the same tokens with and without it. A proposer
 * only changes how many steps that takes.
 *
 * Proposers here: `ngram` (prompt lookup, vLLM's method "ngram"): the longest suffix of
 * the sequence, of prompt_lookup_max down to prompt_lookup_min tokens, that occurred
 * earlier in the sequence; its latest earlier occurrence's continuation is the guess.
 * `draft_model` (draft.c): a smaller model with the same vocabulary, in a runner of its own,
 * guessing greedily. `mtp` (mtp.c): the target's own multi-token-prediction layer
 * (DeepSeek-V3's nextn), which reads the target's final hidden states: the engine hands
 * them over after every step (observe).
 *
 * Configuration is vLLM's --speculative-config JSON: {"method": "ngram",
 * "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
 * or {"model": "draft.gguf", "num_speculative_tokens": 5} (spec_config_parse).
 */
#ifndef WELD_SPEC_SPEC_H
#define WELD_SPEC_SPEC_H

#include "core/err.h"

struct model;

#include <stdbool.h>
#include <stdint.h>

#define SPEC_MAX_TOKENS 16 /* num_speculative_tokens at most */

enum spec_method { SPEC_NONE = 0, SPEC_NGRAM, SPEC_DRAFT_MODEL, SPEC_MTP, SPEC_CUSTOM };

struct spec_config {
    enum spec_method method;
    int num_tokens;             /* num_speculative_tokens: guesses per step, 1..SPEC_MAX_TOKENS */
    int lookup_min, lookup_max; /* ngram: suffix lengths tried, longest first */
    char draft_model[1024];     /* draft_model: its path */
};

/* One sequence's question to a proposer: up to max_k guesses for what follows tokens[0, n)
   of sequence seq_key, into out; n_out: how many it gave (0: none). */
struct spec_ask {
    uint64_t seq_key;
    const int32_t *tokens;
    int n, max_k;
    int32_t *out; /* (max_k) */
    int n_out;
    float *logits;         /* (max_k, n_vocab) a model proposer's logits behind each guess, or
                      NULL: not wanted */
    const int32_t *blocks; /* (n_blocks) the sequence's KV block table in the engine's block
                              manager (its computed positions), or NULL */
    int n_blocks;
};

struct spec_proposer {
    /* Up to max_k guesses for what follows tokens[0, n) of sequence seq_key into out;
       returns how many (0: none). Must not keep pointers into tokens. May be NULL when
       propose_batch is given. */
    int (*propose)(struct spec_proposer *p, uint64_t seq_key, const int32_t *tokens, int n,
                   int max_k, int32_t *out);
    /* Every sequence of a step at once (a draft model runs them as one batch per draft
       token); sets each ask's n_out. May be NULL: the engine asks one by one. Distinct
       seq_keys. */
    void (*propose_batch)(struct spec_proposer *p, struct spec_ask *asks, int n);
    /* The sequence will not be asked about again (finished or aborted). May be NULL. */
    void (*forget)(struct spec_proposer *p, uint64_t seq_key);
    /* The target's final hidden states (after its final norm: the LM head's input) of
       positions [pos, pos + n) of sequence seq_key, computed by the step just run from the
       sequence's tokens[0, pos + n); rows (n, hidden_dim). Called after each step that
       computed positions of a sequence the proposer may be asked about, before its tokens
       are sampled; what came from pos on before is replaced (a rejected guess, a
       recomputation). Positions never handed over (a prefix-cache hit) have none. NULL
       with hidden_dim 0: not wanted. */
    void (*observe)(struct spec_proposer *p, uint64_t seq_key, int pos, int n,
                    const int32_t *tokens, const float *hidden);
    /* child starts as a copy of parent (n > 1 sampling forks after the prompt). May be
       NULL. */
    void (*fork)(struct spec_proposer *p, uint64_t parent_key, uint64_t child_key);
    int hidden_dim;
    uint64_t computed; /* positions a model proposer has run through its model */
    uint64_t failures; /* its forward passes that failed (those sequences got no guesses) */
    void (*free)(struct spec_proposer *p);
    int n_vocab;     /* the vocabulary its guesses come from (0: any; the engine checks it) */
    bool runs_model; /* it computes on the cores: the engine parks its own workers first */
};

/* Parse vLLM's --speculative-config JSON text into c (defaults: ngram min 1, max 4, 4
   tokens when a method is named without them). Errors name the field. */
int spec_config_parse(const char *json, struct spec_config *c, struct weld_err *e);
/* The same with a draft model given apart (--model-draft / -md, NULL: none), which is the
   "model" when the JSON names no method and no model. */
int spec_config_parse_draft(const char *json, const char *draft, struct spec_config *c,
                            struct weld_err *e);

/* What the engine serves, for a proposer that keeps state per sequence. */
struct spec_limits {
    const struct model *target; /* the model verified against (mtp reads its layers) */
    int max_ctx;                /* positions per sequence (0: the draft's own context) */
    int max_seqs;               /* sequences running at once (0: 16) */
    int64_t kv_tokens;          /* positions the engine's KV pool holds (0: max_seqs x max_ctx) */
    int block_size;             /* the engine's KV block size (0: 16); kv_tokens / block_size block
                          ids, which spec_ask.blocks name */
};

/* A proposer for c: ngram, a draft model loaded from c->draft_model (its KV a pool of its
   own indexed by the engine's block ids: spec_ask.blocks; lim->max_seqs sequences at once)
   or the MTP layer of lim->target. */
int spec_proposer_create(struct spec_proposer **out, const struct spec_config *c,
                         const struct spec_limits *lim, struct weld_err *e);
/* What c's proposer adds to the engine's memory per KV block of block_size positions (its
   pool is indexed by the engine's block ids) and in weights, so the engine can size its
   pool for both; zeros for ngram. Loads a draft model's header to know. */
int spec_proposer_cost(const struct spec_config *c, const struct model *target, int block_size,
                       size_t *block_bytes, size_t *weight_bytes, struct weld_err *e);
/* The draft-model proposer (draft.c). */
int spec_draft_create(struct spec_proposer **out, const char *path, const struct spec_limits *lim,
                      struct weld_err *e);
/* The MTP proposer (mtp.c) over lim->target's first multi-token-prediction layer. */
int spec_mtp_create(struct spec_proposer **out, const struct spec_limits *lim, struct weld_err *e);
void spec_proposer_free(struct spec_proposer *p);

/* The ngram guess itself (what the ngram proposer calls): up to max_k tokens. */
int spec_ngram_propose(const int32_t *tokens, int n, int lookup_min, int lookup_max, int max_k,
                       int32_t *out);

#endif
