/*
 * fuzz_tokenizer_json - libFuzzer target for the tokenizer.json loader.
 *
 * The input is a tokenizer.json image. If it loads, a fixed text (ASCII, a special-looking
 * token, multi-byte characters, whitespace runs, digits) is encoded with every
 * add_special/parse_special combination, decoded with and without skip_special, and
 * streamed through detok; any crash, leak or sanitizer report is a bug. Load errors are
 * expected for almost all inputs. Seeds: tests/fuzz/corpus/fuzz_tokenizer_json/.
 */
#include "core/alloc.h"
#include "tokenizer/tokenizer.h"

#include <stdint.h>
#include <string.h>

static const char text[] = "Hello <|x|> world!\n\n  caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC 12345 "
                           "\xF0\x9F\x98\x80 <s></s> a\tb";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct weld_err e;
    struct tokenizer *t = NULL;
    if (tokenizer_load_hf_json_buf(&t, (const char *)data, size, "fuzz.json", &e) != WELD_OK)
        return 0;
    for (int mode = 0; mode < 4; mode++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (tokenizer_encode(t, text, sizeof text - 1, mode & 1, mode & 2, &ids, &n, &e) ==
            WELD_OK) {
            for (int skip = 0; skip < 2; skip++) {
                char *out = NULL, buf[8];
                size_t len = 0;
                if (tokenizer_decode(t, ids, n, skip, &out, &len, &e) == WELD_OK)
                    wfree(out);
                struct detok *d = detok_create(t, skip);
                for (size_t i = 0; d && i < n; i++)
                    for (int32_t id = ids[i]; detok_push(d, id, buf, sizeof buf) > 0; id = -1)
                        ;
                while (d && detok_flush(d, buf, sizeof buf) > 0)
                    ;
                detok_free(d);
            }
        }
        wfree(ids);
    }
    tokenizer_free(t);
    return 0;
}
