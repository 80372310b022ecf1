/*
 * request - one generation request: its parameters, its prompt, and the output path of
 * each of its n sequences (sampling, detokenizing, stop conditions, callbacks).
 *
 * Lifecycle (the engine drives it; nothing here knows about KV blocks or scheduling):
 *   request_encode_prompt()  text / chat messages / ids -> prompt ids
 *   request_create()         validated deep copy of the params, one struct request_seq per
 *                            sequence (sampler seeded with seed + i * golden ratio, detok,
 *                            stop matcher)
 *   request_seq_step()       per sequence per step, with its logits row: logprobs of the
 *                            raw row, min_tokens masking, sampling, then the output path
 *                            below; may finish the sequence
 *   request_finish_all()     abort / error: every unfinished sequence gets on_finish
 *
 * Output path of one sampled token t (vLLM semantics):
 *   - EOS / end-of-generation (unless ignore_eos) or t in stop_token_ids: finish "stop";
 *     t counts as generated and is reported in the delta's token ids but adds no text
 *     (a stop token id's text is kept only with include_stop_str_in_output);
 *   - otherwise t goes through the streaming detokenizer (whole UTF-8 characters only) and
 *     the stop-string matcher (engine/stop.h), which holds back any suffix that could start
 *     a stop string and cuts the text before a completed one: finish "stop";
 *   - after max_tokens tokens, or when the sequence reaches the context limit: the held
 *     text is flushed (it may still complete a stop string) and the finish is "length".
 *   - min_tokens: until that many tokens were generated, EOS / eog ids and stop_token_ids
 *     get -inf logits (so they cannot be sampled) and stop strings are not matched.
 * Each step calls on_delta once per sampled token (text may be empty while held back), and
 * on_finish once per sequence, after its last delta.
 *
 * logit_bias (OpenAI's): each listed token's logit gets its bias added before sampling
 * (after min_tokens masking, before penalties and temperature); a repeated id adds twice.
 *
 * Logprobs are of the raw logits row (before min_tokens masking, penalties, temperature),
 * as vLLM reports them by default: the sampled token's and the top-N alternatives.
 * prompt_logprobs (vLLM's): the same for every prompt token but the first, from the row of
 * the position before it, in each sequence's request_result; with it max_tokens may be 0
 * (score the prompt only: finish "length", nothing sampled).
 *
 * Kinds: REQUEST_KIND_EMBED only runs the prompt; the final hidden state (after the final
 * norm) of its last token (REQUEST_POOLING_LAST, the default: vLLM's for decoder models),
 * or the mean of every prompt token's (REQUEST_POOLING_MEAN), L2-normalised, is its
 * request_result's embedding, and it finishes "stop" with no tokens (n is 1, sampling
 * fields are ignored).
 *
 * Not thread-safe; callbacks run on the caller's thread inside request_seq_step.
 */
#ifndef WELD_ENGINE_REQUEST_H
#define WELD_ENGINE_REQUEST_H

#include "core/err.h"
#include "engine/sampler.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;
struct stop_matcher;
struct detok;
struct gspace;
struct gvocab;
struct gmatch;

#define REQUEST_MAX_N 256
#define REQUEST_MAX_LOGPROBS 20
#define REQUEST_MAX_STOPS 64

enum request_finish {
    REQUEST_FINISH_NONE = 0, /* still running */
    REQUEST_FINISH_STOP,     /* EOS, a stop token id or a stop string */
    REQUEST_FINISH_LENGTH,   /* max_tokens or the context limit */
    REQUEST_FINISH_ABORT,    /* engine_abort */
    REQUEST_FINISH_ERROR,    /* rejected or failed; the result carries the message */
};
/* "stop", "length", "abort", "error" (NULL for NONE). */
const char *request_finish_str(enum request_finish f);

enum request_kind {
    REQUEST_KIND_GENERATE = 0, /* sample tokens */
    REQUEST_KIND_EMBED,        /* run the prompt, report its pooled hidden state */
};

enum request_pooling {
    REQUEST_POOLING_LAST = 0,  /* the last prompt token's hidden state */
    REQUEST_POOLING_MEAN,      /* the mean over the prompt's tokens */
};

struct request_params {
    enum request_kind kind;          /* default GENERATE */
    enum request_pooling pooling;    /* REQUEST_KIND_EMBED: default LAST */
    /* the prompt: exactly one of these three */
    const char *prompt;              /* text, encoded with the model's tokenizer */
    const int32_t *prompt_ids;       /* (n_prompt_ids) token ids, used as given */
    int n_prompt_ids;
    const json_t *messages;          /* [{role, content}...] through the chat template */
    const char *chat_template;       /* Jinja source for messages; NULL: the model's (used
                                        only while encoding, never copied) */
    bool add_special_tokens;         /* BOS etc. for text prompts (default true) */

    struct sampler_params sampling;  /* sampling.seed is used only when has_seed */
    bool has_seed;                   /* false: the engine derives a seed from the id */
    int max_tokens;                  /* >= 1, default 16 (vLLM's default) */
    int min_tokens;                  /* [0, max_tokens], default 0 */
    const char *const *stop;         /* (n_stop) stop strings, UTF-8, non-empty */
    int n_stop;
    const int32_t *stop_token_ids;   /* (n_stop_token_ids) */
    int n_stop_token_ids;
    const int32_t *logit_bias_ids;   /* (n_logit_bias) token ids, each in [0, n_vocab) */
    const float *logit_bias;         /* (n_logit_bias) added to those logits before sampling */
    int n_logit_bias;
    bool ignore_eos;
    bool include_stop_str_in_output;
    bool skip_special_tokens;        /* default true */
    int n;                           /* sequences per prompt, [1, REQUEST_MAX_N] */
    int logprobs;                    /* -1 off; 0: sampled token only; N: plus top N */
    int prompt_logprobs;             /* -1 off; N in [0, 20]: each prompt token's logprob
                                        (all but the first) plus the top N */
    int priority;                    /* lower runs first under the priority policy */
    const char *cache_salt;          /* NULL or a string mixed into prefix-cache hashes */
    const char *grammar;             /* NULL, or GBNF (grammar/) every sequence's output
                                        must match: compiled by the engine, not copied */
    bool kv_save;                    /* once its prompt is computed, hand the prompt's full
                                        KV blocks to the KV tier (a prefill worker handing
                                        the sequence to a decode worker; needs a tier); the
                                        result's kv_ticket says when they are written */
    int kv_remote_tokens;            /* >= 0: a prefill worker saved this many of its prompt
                                        tokens for this (decode) engine to load (counted in
                                        the stats); -1: none (the default) */
};

/* One token's log-probabilities (pointers valid during the callback only). */
struct request_logprob {
    int32_t token;
    float logprob;
    int n_top;
    const int32_t *top_ids;          /* (n_top), most probable first */
    const float *top_logprobs;       /* (n_top) */
};

struct request_result {
    uint64_t req_id;
    int seq_index;
    enum request_finish finish;
    const char *stop_reason;         /* the matched stop string, or NULL */
    int32_t stop_token;              /* the EOS / stop token id that ended it, or -1 */
    const char *error;               /* REQUEST_FINISH_ERROR: the message */
    int n_prompt_tokens, n_cached_tokens, n_generated_tokens;
    int n_tier_tokens;               /* of the cached ones, loaded from the KV tier */
    int n_kv_saved_tokens;           /* kv_save: prompt tokens whose blocks were saved */
    uint64_t kv_saved_hash[2];       /* ... the prefix hash of the last of them (lo, hi) */
    uint64_t kv_ticket;              /* ... written once engine_tier_wait(ticket) returns */
    double t_queue;                  /* seconds from arrival to first scheduled */
    double t_first_token;            /* seconds from arrival to first token (TTFT) */
    double t_total;                  /* seconds from arrival to finish */
    /* prompt_logprobs: (n_prompt_logprobs = n_prompt_tokens) entry i for prompt token i;
       entry 0 (no context) has token set, n_top 0 and logprob NAN; NULL when off or
       when the request failed before every prompt token was scored */
    const struct request_logprob *prompt_logprobs;
    int n_prompt_logprobs;
    /* REQUEST_KIND_EMBED: the embedding (n_embedding = model dim floats, unit L2 norm) */
    const float *embedding;
    int n_embedding;
};

struct request_callbacks {
    void *user;
    /* text[0..len) is never split inside a UTF-8 character nor a stop string; tokens /
       logprobs: the tokens sampled this step (n_tokens, 0 or 1; logprobs NULL when off) */
    void (*on_delta)(void *user, uint64_t req_id, int seq_index, const char *text,
                     size_t len, const int32_t *tokens, int n_tokens,
                     const struct request_logprob *logprobs);
    void (*on_finish)(void *user, uint64_t req_id, int seq_index,
                      const struct request_result *result);
};

struct request_seq {
    int index;
    struct sampler *smp;
    struct detok *dt;
    struct stop_matcher *stop;
    int32_t *tokens;                 /* (cap_tokens) generated tokens, n_tokens used */
    int n_tokens, cap_tokens;
    enum request_finish finish;
    int32_t stop_token;
    char *text;                      /* (cap_text) scratch for one step's delta */
    size_t cap_text;
    struct gmatch *gm;               /* request_constrain: the output so far, matched */
};

struct request {
    uint64_t id;
    struct request_params p;         /* deep copy: strings and arrays below are owned */
    int32_t *prompt;                 /* (n_prompt) */
    int n_prompt;
    int n_cached;                    /* prompt tokens served from the prefix cache */
    int n_tier;                      /* of them, loaded from the KV tier */
    int n_kv_saved;                  /* kv_save: tokens saved, and the last block's hash */
    uint64_t kv_saved_hash[2];
    uint64_t kv_ticket;              /* engine_tier_wait's ticket for them */
    const struct tokenizer *tok;     /* may be NULL (tests): no text, no eog ids */
    int n_vocab;
    struct request_seq *seqs;        /* (n_seqs = p.n) */
    int n_seqs, n_finished;
    struct request_callbacks cb;
    double t_arrival, t_scheduled, t_first_token, t_finish; /* time_now(); 0: not yet */
    int32_t *edit_ids;               /* (n_eog + n_stop_token_ids + n_logit_bias) one */
    float *edit_vals;                /* step's sampler_edits: masks, then biases */
    int32_t *top_ids;                /* (REQUEST_MAX_LOGPROBS) */
    float *top_lps;                  /* (REQUEST_MAX_LOGPROBS) */
    int32_t *eog_ids;                /* (n_eog) ids masked under min_tokens */
    int n_eog;
    int n_prompt_lp;                 /* prompt positions [0, n_prompt_lp) scored */
    struct request_logprob *plp;     /* (n_prompt) prompt_logprobs, their tops in: */
    int32_t *plp_ids;                /* (n_prompt * prompt_logprobs) */
    float *plp_lps;
    float *emb;                      /* (n_emb) REQUEST_KIND_EMBED: the embedding */
    int n_emb;
    double *emb_sum;                 /* (n_emb) POOLING_MEAN: sum of the hidden states of */
    int n_emb_pos;                   /* prompt positions [0, n_emb_pos) */
    char *error;                     /* message for REQUEST_FINISH_ERROR */
    const struct gvocab *gv;         /* request_constrain: the vocabulary's bytes */
    uint32_t *allow;                 /* ((n_vocab + 31) / 32) one step's token mask */
    long long n_masks;               /* masks computed, and their seconds */
    double t_masks;
};

/* vLLM's defaults: temperature 1, max_tokens 16, n 1, logprobs off, special tokens added
   to text prompts and skipped in output. */
struct request_params request_params_default(void);
/* WELD_ERR_INVALID_ARG naming the field ("max_tokens", "stop[2]", ...). n_vocab <= 0
   skips the token-range checks. */
int request_params_check(const struct request_params *p, int n_vocab, struct weld_err *e);

/* The prompt's token ids (*ids is heap memory, wfree). Text prompts get the tokenizer's
   special tokens if add_special_tokens; chat messages are rendered with the model's
   template (add_generation_prompt) and get no second BOS. */
int request_encode_prompt(const struct tokenizer *tok, const struct request_params *p,
                          int32_t **ids, int *n_ids, struct weld_err *e);

/* Validate p, copy it and the prompt, and set up p->n sequences. tok may be NULL. */
int request_create(struct request **out, uint64_t id, const struct request_params *p,
                   const int32_t *prompt, int n_prompt, const struct tokenizer *tok,
                   int n_vocab, const struct request_callbacks *cb, struct weld_err *e);
void request_free(struct request *r);

/* Constrain every sequence to sentences of g: each step samples only tokens whose bytes
   continue a sentence (gmatch_mask), end-of-generation ids only where one may end (never
   with ignore_eos), and a sequence whose sentence is complete and allows no more bytes
   finishes "stop" without a token; one whose constraint allows no token of the
   vocabulary although the sentence is incomplete finishes "error" saying so. The matchers
   live in space sp (grammar.h: one grammar's, shared with other requests of it); sp and v
   must outlive r. Call before the first step. */
int request_constrain(struct request *r, struct gspace *sp, const struct gvocab *v,
                      struct weld_err *e);

/* Constrained sequence i: the text its grammar forces next (grammar.h gmatch_forced) as
   tokens, each the longest that spells what is left (at most max); 0 when nothing is
   forced or the request has no constraint. The engine drafts them (jump-forward). */
int request_seq_forced(struct request *r, int i, int32_t *out, int max);

/* Sample sequence i's next token from its logits row (n_vocab floats, not modified) and
   run the output path. top: the row's largest logits from the backend (exec/logits_top.h),
   or NULL; with it greedy and top-k sampling skip the pass over the row (same token).
   at_ctx_limit: the sequence has no room for another token, so it finishes "length"
   unless something else stops it. *finished: it has now finished. */
int request_seq_step(struct request *r, int i, const float *logits,
                     const struct logits_top *top, bool at_ctx_limit, bool *finished,
                     struct weld_err *e);
/* prompt_logprobs: rows[k] (n_vocab floats) is the logits row of prompt position
   first + k, k < n_rows; scores prompt tokens first + k + 1 not scored yet. */
void request_prompt_logprobs(struct request *r, int first, const float *rows, int n_rows);
/* REQUEST_POOLING_MEAN: rows[k] (dim floats) is the final hidden state of prompt position
   first + k, k < n_rows; adds the positions not added yet. */
int request_embed_rows(struct request *r, int first, const float *rows, int n_rows, int dim,
                       struct weld_err *e);
/* REQUEST_KIND_EMBED: pool (h: dim floats, the last prompt token's final hidden state;
   MEAN: the rows added), normalise, finish "stop" with it as the result's embedding. */
int request_embed_done(struct request *r, const float *h, int dim, struct weld_err *e);
/* max_tokens 0: the prompt was scored; finish every sequence "length". */
void request_finish_prompt_only(struct request *r);
/* The last token of sequence i that the model has not consumed yet (its last generated
   token), or -1 before the first. */
int32_t request_seq_last_token(const struct request *r, int i);
/* Finish every unfinished sequence with reason f (ABORT or ERROR; msg for ERROR), without
   flushing held text, calling on_finish for each. */
void request_finish_all(struct request *r, enum request_finish f, const char *msg);
bool request_done(const struct request *r);

#endif
