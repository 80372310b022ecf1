/*
 * access - the access log of `weld serve`: one line per HTTP request on stderr (log_info,
 * so WELD_LOG=warn silences it too), on unless --disable-log-requests:
 *
 *   weld: request id=cmpl-6b13d08000000001 client=127.0.0.1:53412 method=POST
 *         path=/v1/completions status=200 prompt_tokens=5 completion_tokens=16
 *         ttft_s=0.012 total_s=0.105 finish=length                       (one line)
 *
 * http.c records the method, path and arrival of each request and prints the line from
 * MHD's completion callback (after the last byte of the answer was handed to the socket, or
 * when the connection failed); a generation route (routes.c) fills in its response id,
 * token counts, first-token time and the finish reasons while it runs.
 *
 * Fields that do not apply (a GET, a request refused before it ran) are "-". status 499
 * means no answer was sent (the client went away first), as nginx writes it. ttft_s is
 * arrival to the first generated token reaching the request's thread; total_s is arrival to
 * completion. finish lists the distinct reasons of the choices (stop, length, abort, error)
 * joined by ","; a choice that never finished (client gone) counts as abort. The prompt is
 * printed only with --log-prompts, as prompt=JSON (a string, or an array for several
 * prompts; each cut at 4096 bytes); headers (API keys) never are.
 */
#include "server/http.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"

#include <stdio.h>
#include <string.h>

#define ACCESS_PROMPT_MAX 4096

void http_access_prompt(struct http_access *a, const struct server_req *r)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < r->n_prompts; i++) {
        const struct server_prompt *p = &r->prompts[i];
        size_t n = p->text_len < ACCESS_PROMPT_MAX ? p->text_len : ACCESS_PROMPT_MAX;
        while (p->text && n > 0 && n < p->text_len && ((unsigned char)p->text[n] & 0xC0) == 0x80)
            n--; /* cut at a character boundary */
        json_t *str = p->text ? json_stringn(p->text, n) : NULL;
        json_array_append_new(arr, str ? str : json_string(""));
    }
    json_t *v = arr && r->n_prompts == 1 ? json_incref(json_array_get(arr, 0)) : json_incref(arr);
    json_decref(arr);
    char *txt = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
    json_decref(v);
    wfree(a->prompt);
    a->prompt = txt ? wstrdup(txt) : NULL;
    free(txt);
}

void http_access_log(struct server *s, struct MHD_Connection *c, struct http_access *a,
                     unsigned status)
{
    if (!s->o.log_requests || !a->method[0])
        return;
    char addr[80], pt[16] = "-", ct[16] = "-", ttft[32] = "-", fin[64] = "-";
    httpd_client_addr(c, addr, sizeof addr);
    if (a->generation) {
        if (a->n_finished > 0)
            snprintf(pt, sizeof pt, "%d", a->prompt_tokens);
        snprintf(ct, sizeof ct, "%d", a->n_finished < a->n_choices && a->delta_tokens >
                 a->completion_tokens ? a->delta_tokens : a->completion_tokens);
        if (a->t_first > 0)
            snprintf(ttft, sizeof ttft, "%.3f", a->t_first - a->t_start);
        unsigned seen = a->finish_seen;
        if (a->n_finished < a->n_choices)
            seen |= 1u << REQUEST_FINISH_ABORT;
        size_t w = 0;
        for (int f = REQUEST_FINISH_NONE + 1; f <= REQUEST_FINISH_ERROR; f++)
            if (seen & (1u << f) && w < sizeof fin)
                w += (size_t)snprintf(fin + w, sizeof fin - w, "%s%s", w ? "," : "",
                                      request_finish_str((enum request_finish)f));
        if (!w)
            snprintf(fin, sizeof fin, "-");
    }
    log_info("request id=%s client=%s method=%s path=%s status=%u prompt_tokens=%s "
             "completion_tokens=%s ttft_s=%s total_s=%.3f finish=%s%s%s",
             a->id[0] ? a->id : "-", addr, a->method, a->path, status ? status : 499, pt, ct,
             ttft, time_now() - a->t_start, fin, s->o.log_prompts && a->prompt ? " prompt=" : "",
             s->o.log_prompts && a->prompt ? a->prompt : "");
}
