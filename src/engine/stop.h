/*
 * stop - the stop-string matcher between the streaming detokenizer and the client.
 *
 * Text arrives in pieces (each detok_push output, which is always whole UTF-8 characters)
 * and leaves as deltas. The matcher keeps the not-yet-emitted tail in `held`:
 *   - if any stop string occurs in held text, everything before the earliest occurrence is
 *     emitted (plus the stop string itself when include_stop), the match is recorded and
 *     the matcher is done: later pushes emit nothing (vLLM semantics: the stop string is
 *     not part of the output by default);
 *   - otherwise the longest suffix of held text that is a proper prefix of some stop string
 *     stays held and the rest is emitted. So a delta never contains the start of a stop
 *     string that might still complete, and a stop string is never split across deltas.
 * Ties between stop strings at the same position go to the one listed first.
 *
 * UTF-8: stop strings must be valid UTF-8 (stop_create checks), and pushed text is whole
 * characters, so both cut points (before a match, before a held prefix) fall on character
 * boundaries; the cut is still moved back to a boundary defensively.
 *
 * Arming: while not armed (min_tokens not yet reached, as vLLM does it) full matches are
 * ignored; text that could be the start of a stop string is still held back.
 *
 * Deliberately not here: token-level stops (EOS, stop_token_ids) and regex stops.
 */
#ifndef WELD_ENGINE_STOP_H
#define WELD_ENGINE_STOP_H

#include "core/err.h"

#include <stdbool.h>
#include <stddef.h>

struct stop_matcher;

/* Copy n stop strings (each non-empty, valid UTF-8; WELD_ERR_INVALID_ARG naming
   "stop[i]" otherwise). n == 0 gives a matcher that only passes text through. */
int stop_create(struct stop_matcher **out, const char *const *stops, int n, bool include_stop,
                struct weld_err *e);
void stop_free(struct stop_matcher *m);

/* Enable or disable full-match detection (see the top of this file). Starts armed. */
void stop_arm(struct stop_matcher *m, bool armed);

/* Feed len bytes. On return *out / *out_len is the text that may be emitted now (pointing
   into the matcher, valid until the next call); *matched is set when a stop string
   completed, and then stop_matched_index() tells which. WELD_ERR_NOMEM if the held buffer
   cannot grow. After a match every push returns nothing. */
int stop_push(struct stop_matcher *m, const char *text, size_t len, const char **out,
              size_t *out_len, bool *matched, struct weld_err *e);
/* Emit whatever is held (the generation ended for another reason). */
void stop_flush(struct stop_matcher *m, const char **out, size_t *out_len);

/* Index of the stop string that matched, or -1. */
int stop_matched_index(const struct stop_matcher *m);
const char *stop_string(const struct stop_matcher *m, int i);
/* Longest stop string in bytes (0 if none). */
size_t stop_max_len(const struct stop_matcher *m);

/* True if s[0..len) is valid UTF-8 (no overlongs, surrogates or values past U+10FFFF). */
bool stop_utf8_valid(const char *s, size_t len);

#endif
