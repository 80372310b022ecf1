/*
 * structured - a request's structured-output fields, as the GBNF its output must match.
 *
 * The fields, by their OpenAI, vLLM and llama.cpp names (at most one per request):
 *   response_format {"type": "text"} (none), {"type": "json_object"} (any JSON object),
 *     {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} (the schema;
 *     strict or not, the output always matches);
 *   structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object": ...} and
 *     the older guided_json (a schema, object or text), guided_regex (the whole output
 *     matches), guided_choice (one of the strings, exactly), guided_grammar (GBNF);
 *   grammar (GBNF) and json_schema (a schema), llama.cpp's server fields.
 * guided_decoding_backend is accepted and ignored (there is one backend);
 * guided_whitespace_pattern and structural tags are refused.
 *
 * Errors are WELD_ERR_INVALID_ARG naming the field, then what the compiler says: the
 * keyword and its path for a schema, the offset for a regex. GBNF is compiled by the
 * engine when the request is added (its errors give line and column).
 */
#ifndef WELD_ENGINE_STRUCTURED_H
#define WELD_ENGINE_STRUCTURED_H

#include "core/err.h"

#include <jansson.h>
#include <stdbool.h>

struct schema_opts;

/* The constraint o's fields ask for: *gbnf (wmalloc'd; NULL: none); opts (NULL: none)
   shape JSON schemas (vLLM's --structured-outputs-config, grammar/schema.h). */
int structured_gbnf(const json_t *o, const struct schema_opts *opts, char **gbnf,
                    struct weld_err *e);
/* The fields structured_gbnf reads (NULL-terminated), for unknown-field lists. */
extern const char *const structured_fields[];

#endif
