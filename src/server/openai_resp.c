/*
 * openai_resp - the JSON the server sends back: whole completion / chat bodies, streaming
 * chunks, usage, logprobs (shapes in openai.h).
 *
 * Completions logprobs are four parallel arrays built token by token: tokens (each token's
 * text decoded alone), token_logprobs, top_logprobs (a {text: logprob} object per token)
 * and text_offset (byte offset of the token's text in the choice's text); with echo the
 * prompt tokens come first (server_lp_prepend_prompt), the first with null logprobs. Chat logprobs
 * are {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
 * finish_reason is "stop" or "length" as OpenAI defines them, "abort" for a request the
 * server cancelled (shutdown) and "error" for one that failed; stop_reason is vLLM's: the
 * matched stop string, the stop token id, or null.
 */
#include "server/openai.h"

#include "core/alloc.h"
#include "tokenizer/tokenizer.h"

#include <string.h>

const char *server_finish_str(enum request_finish f)
{
    const char *s = request_finish_str(f);
    return s ? s : "stop";
}

/* A token's text as it reads inside a sequence: decoded after the BOS token and with the
   BOS text cut off, so SentencePiece tokens keep their leading space (decoding a token
   alone drops it, as Hugging Face's decode does at the start of a text). */
char *server_token_str(const struct tokenizer *tok, int32_t id, size_t *len)
{
    char *s = NULL, *b = NULL;
    size_t lb = 0;
    *len = 0;
    int32_t bos = tok ? tokenizer_bos(tok) : -1;
    int32_t pair[2] = {bos, id};
    if (bos >= 0 && tokenizer_decode(tok, pair, 2, false, &s, len, NULL) == WELD_OK &&
        tokenizer_decode(tok, pair, 1, false, &b, &lb, NULL) == WELD_OK && lb <= *len &&
        !memcmp(s, b, lb)) {
        memmove(s, s + lb, *len - lb + 1);
        *len -= lb;
        wfree(b);
        return s;
    }
    wfree(s);
    wfree(b);
    s = NULL;
    if (tok && tokenizer_decode(tok, &id, 1, false, &s, len, NULL) == WELD_OK && s)
        return s;
    wfree(s);
    char buf[32];
    int n = snprintf(buf, sizeof buf, "token_id:%d", (int)id);
    *len = (size_t)n;
    return wstrdup(buf);
}

static json_t *bytes_json(const char *s, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* json_stringn refuses invalid UTF-8; a lone partial character becomes U+FFFD. */
static json_t *str_json(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    return j ? j : json_string("\xef\xbf\xbd");
}

static json_t *chat_lp_entry(const struct tokenizer *tok, int32_t id, float lp)
{
    size_t n;
    char *s = server_token_str(tok, id, &n);
    json_t *o = json_pack("{s:o, s:f, s:o}", "token", str_json(s ? s : "", s ? n : 0),
                          "logprob", (double)lp, "bytes", bytes_json(s ? s : "", s ? n : 0));
    wfree(s);
    return o;
}

static void lp_chat(const struct tokenizer *tok, json_t **lp, int32_t token, float logprob,
                    int n_top, const int32_t *top_ids, const float *top_lps)
{
    if (!*lp)
        *lp = json_pack("{s:[]}", "content");
    json_t *ent = chat_lp_entry(tok, token, logprob);
    json_t *top = json_array();
    for (int k = 0; k < n_top; k++)
        json_array_append_new(top, chat_lp_entry(tok, top_ids[k], top_lps[k]));
    json_object_set_new(ent, "top_logprobs", top);
    json_array_append_new(json_object_get(*lp, "content"), ent);
}

static void lp_completion(const struct tokenizer *tok, json_t **lp, int32_t token,
                          float logprob, int n_top, const int32_t *top_ids,
                          const float *top_lps, size_t text_offset)
{
    if (!*lp)
        *lp = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs",
                        "top_logprobs", "text_offset");
    size_t n;
    char *s = server_token_str(tok, token, &n);
    json_array_append_new(json_object_get(*lp, "tokens"), str_json(s ? s : "", s ? n : 0));
    wfree(s);
    json_array_append_new(json_object_get(*lp, "token_logprobs"), json_real(logprob));
    json_t *top = json_object();
    for (int k = 0; k < n_top; k++) {
        char *t = server_token_str(tok, top_ids[k], &n);
        json_t *key = str_json(t ? t : "", t ? n : 0);
        json_object_set_new(top, json_string_value(key), json_real(top_lps[k]));
        json_decref(key);
        wfree(t);
    }
    json_array_append_new(json_object_get(*lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(*lp, "text_offset"),
                          json_integer((json_int_t)text_offset));
}

void server_lp_prepend_prompt(const struct tokenizer *tok, json_t **lp,
                              const struct server_prompt_lp *plp, int n, size_t text_len)
{
    json_t *pl = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs",
                           "top_logprobs", "text_offset");
    size_t off = 0;
    for (int i = 0; pl && i < n; i++) {
        size_t len = 0;
        char *s = server_token_str(tok, plp[i].token, &len);
        if (i == 0) {
            json_array_append_new(json_object_get(pl, "tokens"), str_json(s ? s : "", s ? len : 0));
            json_array_append_new(json_object_get(pl, "token_logprobs"), json_null());
            json_array_append_new(json_object_get(pl, "top_logprobs"), json_null());
            json_array_append_new(json_object_get(pl, "text_offset"),
                                  json_integer((json_int_t)off));
        } else {
            lp_completion(tok, &pl, plp[i].token, plp[i].logprob, plp[i].n_top,
                          plp[i].top_ids, plp[i].top_lps, off);
        }
        wfree(s);
        if (!(tok && tokenizer_is_special(tok, plp[i].token)))
            off = off + len < text_len ? off + len : text_len;
    }
    if (pl && *lp) {
        const char *keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
        for (int k = 0; k < 4; k++)
            json_array_extend(json_object_get(pl, keys[k]), json_object_get(*lp, keys[k]));
    }
    if (pl) {
        json_decref(*lp);
        *lp = pl;
    }
}

void server_lp_append(enum server_api api, const struct tokenizer *tok, json_t **lp,
                      int32_t token, float logprob, int n_top, const int32_t *top_ids,
                      const float *top_lps, size_t text_offset)
{
    if (api == SERVER_API_CHAT)
        lp_chat(tok, lp, token, logprob, n_top, top_ids, top_lps);
    else
        lp_completion(tok, lp, token, logprob, n_top, top_ids, top_lps, text_offset);
}

json_t *server_usage_json(int prompt_tokens, int completion_tokens, int cached_tokens)
{
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", prompt_tokens,
                     "completion_tokens", completion_tokens, "total_tokens",
                     prompt_tokens + completion_tokens, "prompt_tokens_details",
                     "cached_tokens", cached_tokens);
}

static json_t *stop_reason_json(const char *stop_reason, int32_t stop_token)
{
    return stop_reason ? json_string(stop_reason)
           : stop_token >= 0 ? json_integer(stop_token) : json_null();
}

static json_t *envelope(const struct server_req *r, const char *id, long created,
                        const char *object)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object", object, "created",
                     (json_int_t)created, "model", r->model);
}

json_t *server_resp_json(const struct server_req *r, const char *id, long created,
                         const struct server_choice *choices, int n_choices,
                         int prompt_tokens, int cached_tokens)
{
    bool chat = r->api == SERVER_API_CHAT;
    json_t *o = envelope(r, id, created, chat ? "chat.completion" : "text_completion");
    json_t *arr = json_array();
    int completion = 0;
    for (int i = 0; i < n_choices; i++) {
        const struct server_choice *c = &choices[i];
        completion += c->n_generated;
        const bool calls = chat && c->n_calls > 0;
        json_t *text = calls && !c->content_len
                           ? json_null()
                           : str_json(c->text ? c->text : "", calls ? c->content_len : c->len);
        json_t *ch = json_pack("{s:i, s:o, s:s, s:o}", "index", i, "logprobs",
                               c->lp ? json_incref(c->lp) : json_null(), "finish_reason",
                               calls && c->finish == REQUEST_FINISH_STOP
                                   ? "tool_calls"
                                   : server_finish_str(c->finish),
                               "stop_reason", stop_reason_json(c->stop_reason, c->stop_token));
        if (chat) {
            json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content", text);
            if (calls)
                json_object_set_new(msg, "tool_calls",
                                    tool_calls_json(c->calls, c->n_calls, id, i));
            json_object_set_new(ch, "message", msg);
        } else {
            json_object_set_new(ch, "text", text);
        }
        json_array_append_new(arr, ch);
    }
    json_object_set_new(o, "choices", arr);
    json_object_set_new(o, "usage", server_usage_json(prompt_tokens, completion, cached_tokens));
    return o;
}

json_t *server_chunk_json(const struct server_req *r, const char *id, long created, int index,
                          const char *text, size_t len, json_t *lp, enum request_finish fin,
                          const char *stop_reason, int32_t stop_token, bool role)
{
    bool chat = r->api == SERVER_API_CHAT;
    json_t *o = envelope(r, id, created, chat ? "chat.completion.chunk" : "text_completion");
    json_t *ch = json_pack("{s:i, s:o, s:o}", "index", index, "logprobs",
                           lp ? lp : json_null(), "finish_reason",
                           fin ? json_string(server_finish_str(fin)) : json_null());
    if (fin)
        json_object_set_new(ch, "stop_reason", stop_reason_json(stop_reason, stop_token));
    if (chat) {
        json_t *d = json_object();
        if (role)
            json_object_set_new(d, "role", json_string("assistant"));
        if (len || role)
            json_object_set_new(d, "content", str_json(text ? text : "", len));
        json_object_set_new(ch, "delta", d);
    } else {
        json_object_set_new(ch, "text", str_json(text ? text : "", len));
    }
    json_object_set_new(o, "choices", json_pack("[o]", ch));
    return o;
}

json_t *server_tool_chunk_json(const struct server_req *r, const char *id, long created, int index,
                               const struct tool_call *calls, int n_calls)
{
    json_t *o = envelope(r, id, created, "chat.completion.chunk");
    json_t *tc = tool_calls_json(calls, n_calls, id, index);
    size_t i;
    json_t *x;
    json_array_foreach(tc, i, x) json_object_set_new(x, "index", json_integer((json_int_t)i));
    json_t *ch = json_pack("{s:i, s:n, s:n, s:{s:o}}", "index", index, "logprobs", "finish_reason",
                           "delta", "tool_calls", tc);
    json_object_set_new(o, "choices", json_pack("[o]", ch));
    return o;
}

json_t *server_usage_chunk_json(const struct server_req *r, const char *id, long created,
                                json_t *usage)
{
    bool chat = r->api == SERVER_API_CHAT;
    json_t *o = envelope(r, id, created, chat ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage);
    return o;
}
