/*
 * fuzz_json_schema - grammar_gbnf_from_json_schema on arbitrary bytes.
 *
 * Properties: no crash, no leak, no UB (ASan + UBSan); every grammar the converter writes
 * compiles (a refusal is the converter's, never the GBNF compiler's) and gives a matcher.
 * Seeds: an object with required keys, a recursive $ref, enums and arrays.
 */
#include "grammar/grammar.h"
#include "grammar/schema.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *gbnf = NULL;
    struct weld_err e;
    if (grammar_gbnf_from_json_schema((const char *)data, size, &gbnf, &e) != WELD_OK)
        return 0;
    struct grammar *g = NULL;
    int rc = grammar_parse_gbnf(&g, gbnf, strlen(gbnf), NULL, &e);
    free(gbnf);
    WELD_ASSERT(rc == WELD_OK);
    struct gmatch *m = NULL;
    WELD_ASSERT(gmatch_create(&m, g, &e) == WELD_OK);
    (void)gmatch_accept(m, (const uint8_t *)"{\"a\": [1, \"x\", null]}", 20);
    gmatch_free(m);
    grammar_free(g);
    return 0;
}
