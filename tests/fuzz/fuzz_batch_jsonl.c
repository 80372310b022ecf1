/*
 * fuzz_batch_jsonl - libFuzzer target for the `weld batch` request line parser
 * (engine/batch_io.h). The input is split into lines the way cmd_batch reads a file; each
 * line goes through batch_line_parse(), and on success everything the parsed params point
 * at is touched (every string byte, every id, the messages tree dumped back to text) and
 * request_params_check() runs on them, so a dangling pointer or a bad count shows up under
 * ASan. Errors are expected; crashes, leaks and sanitizer reports are the findings.
 * Seeds: tests/fuzz/corpus/fuzz_batch_jsonl/ (one small request line each).
 */
#include "engine/batch_io.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t sink;

static void touch_str(const char *s)
{
    if (s)
        sink += strlen(s);
}

static void touch(const struct request_params *p)
{
    touch_str(p->prompt);
    touch_str(p->cache_salt);
    for (int i = 0; i < p->n_prompt_ids; i++)
        sink += (uint64_t)p->prompt_ids[i];
    for (int i = 0; i < p->n_stop_token_ids; i++)
        sink += (uint64_t)p->stop_token_ids[i];
    for (int i = 0; i < p->n_stop; i++)
        touch_str(p->stop[i]);
    if (p->messages) {
        char *s = json_dumps(p->messages, JSON_COMPACT);
        touch_str(s);
        free(s);
    }
    struct weld_err e = {0};
    sink += (uint64_t)request_params_check(p, 32000, &e);
    touch_str(e.msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    size_t start = 0;
    int line_no = 0;
    while (start < size) {
        const char *nl = memchr(text + start, '\n', size - start);
        size_t end = nl ? (size_t)(nl - text) : size;
        line_no++;
        struct batch_line l;
        struct weld_err e = {0};
        if (batch_line_parse(text + start, end - start, line_no, NULL, &l, &e) == WELD_OK)
            touch(&l.p);
        else
            touch_str(e.msg);
        if (l.id) {
            char *s = json_dumps(l.id, JSON_COMPACT | JSON_ENCODE_ANY);
            touch_str(s);
            free(s);
        }
        batch_line_release(&l);
        start = end + 1;
    }
    return 0;
}
