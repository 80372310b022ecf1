/*
 * batch_io - one line of a `weld batch` JSONL input -> struct request_params.
 *
 * A line is one JSON object: either the request itself or an OpenAI batch line
 * ({"custom_id": ..., "body": {...}}, the request being "body"). A request has "prompt" (a
 * string, or an array of token ids), "prompt_token_ids" or "messages" (passed through to
 * the chat template as given: string or list-of-parts content alike), and sampling
 * parameters by their OpenAI / vLLM names: max_tokens (max_completion_tokens), min_tokens,
 * temperature, top_p, top_k, min_p, repetition_penalty, frequency_penalty,
 * presence_penalty, seed, stop (string or array), stop_token_ids, logit_bias (an object
 * {"token id": bias}), ignore_eos, n, logprobs
 * (int, or true with top_logprobs), priority, cache_salt, include_stop_str_in_output,
 * skip_special_tokens, add_special_tokens, and the structured-output fields
 * (response_format, structured_outputs, guided_*: engine/structured.h, compiled to
 * p.grammar). JSON null is "absent". Fields that would
 * change the output but are not implemented (tools unless tool_choice is "none",
 * tool_choice other than "none", suffix, best_of above n, beam search, ...) are refused, naming the
 * field; other unknown keys are ignored and listed in batch_line.unknown
 * (batch_line_parse logs the first line that has any, once per process).
 *
 * Layout: struct batch_line owns a reference to the parsed JSON document; every string of
 * its request_params (prompt, stop strings, cache_salt) and its messages point into that
 * document, and the id / stop / logit_bias arrays are heap copies, so the params stay valid until
 * batch_line_release(). The id is the request's "id", else the line's "custom_id", else
 * NULL (the caller numbers the line).
 *
 * Errors start with "line N" (", column C" for bad JSON) and name the field, e.g.
 * "line 3: field 'stop[1]': expected a string". The id is filled in whenever the line was
 * JSON, even when a field is bad, so the caller can report the error under it.
 *
 * Ranges: the OpenAI / vLLM API's are checked here (temperature in [0, 2], top_k -1, 0 or
 * >= 1, presence and frequency penalties in [-2, 2], repetition_penalty > 0, logprobs and
 * top_logprobs in [0, 20], logit_bias values in [-100, 100], n and max_tokens >= 1), so the
 * server and `weld batch` agree; the engine's own invariants (token ids below n_vocab,
 * min_tokens <= max_tokens, ...) stay in request_params_check(), which
 * engine_add_request() runs. CLI flags go only through the latter.
 */
#ifndef WELD_ENGINE_BATCH_IO_H
#define WELD_ENGINE_BATCH_IO_H

#include "core/err.h"
#include "engine/request.h"

struct schema_opts;

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct batch_line {
    struct request_params p;  /* valid after WELD_OK, until batch_line_release */
    json_t *id;               /* borrowed from root: "id" / "custom_id", or NULL */
    json_t *root;             /* owned reference to the parsed line */
    int32_t *prompt_ids;      /* (p.n_prompt_ids) */
    int32_t *stop_ids;        /* (p.n_stop_token_ids) */
    const char **stops;       /* (p.n_stop) pointers into root */
    int32_t *bias_ids;        /* (p.n_logit_bias) */
    float *bias;              /* (p.n_logit_bias) */
    char *gbnf;               /* p.grammar: the structured-output constraint, or NULL */
    char unknown[256];        /* "" or the ignored unknown keys, ", "-separated (cut: ", ...") */
};

/* Parse text[0..len) (one line, no newline needed) numbered line_no for messages; opts
   (NULL: none) shape the JSON of structured outputs (grammar/schema.h). On
   failure *out is still safe to release, and out->id is set if the line was JSON. */
int batch_line_parse(const char *text, size_t len, int line_no, const struct schema_opts *opts,
                     struct batch_line *out, struct weld_err *e);
/* Parse an already-loaded request object (no "body" unwrapping, no id). */
int batch_request_parse(const json_t *o, int line_no, const struct schema_opts *opts,
                        struct batch_line *out, struct weld_err *e);
/* Frees what the line owns and zeroes it; safe on a zeroed or failed line. */
void batch_line_release(struct batch_line *l);

#endif
