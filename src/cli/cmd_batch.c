/*
 * cmd_batch - `weld batch`: offline generation for a JSONL file of requests.
 *
 * Input: one JSON object per line, either the request itself or an OpenAI batch line
 * ({"custom_id": ..., "body": {...}}), parsed by engine/batch_io.h (which lists the keys:
 * "prompt", "prompt_token_ids" or "messages", and sampling parameters by their OpenAI /
 * vLLM names). Unknown keys are ignored; a key of the wrong type fails that line.
 * "messages" go through the model's chat template, or the --chat-template file or builtin.
 *
 * Output: one JSON object per input line, in input order, written as soon as every earlier
 * line is complete: {"id", "text", "finish_reason", "stop_reason", "token_ids",
 * "prompt_tokens", "cached_tokens", "completion_tokens", "timings": {queue_s, ttft_s,
 * total_s}} plus "choices" (each with index, text, finish_reason, stop_reason, token_ids,
 * logprobs) when n > 1 or logprobs were asked for. A line that fails (bad JSON, a bad
 * field, a prompt that can never fit) gets {"id", "error"} and the others go on.
 *
 * The input is read and parsed whole before the model loads: a missing or unreadable
 * file, one without a non-empty line, or one none of whose lines parses is an error at
 * once. Exit status: 0 when every line succeeded, 1 when any failed (the summary on
 * stderr counts lines: succeeded, failed) or nothing could run, 2 for bad usage.
 *
 * Also here, shared with cmd_bench.c: the engine option table (cli_engine_opts_*).
 */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/err.h"
#include "core/json.h"
#include "core/log.h"
#include "core/progress.h"
#include "engine/batch_io.h"
#include "engine/engine.h"
#include "grammar/schema.h"
#include "template/chat_template.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* ---- engine options shared with cmd_bench --------------------------------------------- */

void cli_engine_opts_init(struct cli_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    struct engine_params d = engine_params_default();
    o->max_num_seqs = d.max_num_seqs;
    o->max_num_batched_tokens = d.max_num_batched_tokens;
    o->block_size = d.block_size;
    o->kv_dtype = "f16";
    o->policy = "fcfs";
}

int cli_engine_opts_table(struct cli_engine_opts *o, struct cli_opt *t)
{
    const struct cli_opt opts[] = {
        {"model", 'm', OPT_STR, &o->model, "MODEL",
         "GGUF file or Hugging Face directory (required)"},
        {"max-num-seqs", 0, OPT_INT, &o->max_num_seqs, "N",
         "sequences running at once (default 64)"},
        {"max-num-batched-tokens", 0, OPT_INT, &o->max_num_batched_tokens, "N",
         "tokens per step (default 2048)"},
        {"max-model-len", 0, OPT_INT, &o->max_model_len, "N",
         "prompt + output tokens per sequence (default: the model's context)"},
        {"kv-cache-memory", 0, OPT_SIZE, &o->kv_cache_memory, "BYTES",
         "KV pool size, e.g. 512M (default: min(half the free memory, what max-num-seqs full sequences need))"},
        {"block-size", 0, OPT_INT, &o->block_size, "N", "tokens per KV block (default 16)"},
        {"kv-cache-dtype", 0, OPT_STR, &o->kv_dtype, "T", "f16 (default), bf16, f32 or q8_0"},
        {"no-prefix-caching", 0, OPT_FLAG, &o->no_prefix_caching, NULL,
         "do not reuse KV blocks of earlier prompts"},
        {"policy", 0, OPT_STR, &o->policy, "P", "fcfs (default) or priority (lower runs first)"},
        {"threads", 't', OPT_INT, &o->threads, "N",
         "forward-pass threads (default: one per physical core, one for models of tiny steps)"},
        {"speculative-config", 0, OPT_STR, &o->spec_config, "JSON",
         "speculative decoding, as vLLM: '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}', method \"mtp\" (DeepSeek's MTP layer) or '{\"model\": \"draft.gguf\"}' (same output, fewer steps)"},
        {"model-draft", 0, OPT_STR, &o->model_draft, "MODEL",
         "draft model for speculative decoding, greedy guesses checked by the model (same output)"},
        {"disable-jump-forward", 0, OPT_FLAG, &o->no_jump_forward, NULL,
         "constrained requests do not draft the text their grammar forces (same output)"},
        {"kv-offload-dir", 0, OPT_STR, &o->kv_offload_dir, "DIR",
         "KV blocks evicted from the pool (and the pool's at exit) are kept in DIR and loaded "
         "back, not recomputed, when a prompt shares their prefix (same output)"},
        {"kv-offload-size", 0, OPT_SIZE, &o->kv_offload_size, "BYTES",
         "budget of --kv-offload-dir, least recently used out first (default 16G)"},
        {"kv-store", 0, OPT_STR, &o->kv_store, "URL",
         "a Redis server shared by workers as a KV tier (redis://HOST[:PORT][/DB] or "
         "unix:///PATH): what one worker saved, another loads"},
    };
    enum { N = sizeof opts / sizeof opts[0] }; /* then --exec, --tune, --accelerator */
    _Static_assert(N + CLI_EXEC_N_OPTS == CLI_ENGINE_N_OPTS, "CLI_ENGINE_N_OPTS");
    memcpy(t, opts, sizeof opts);
    return N + cli_exec_opts_table(&o->exec, t + N);
}

int cli_spec_params(const char *json, const char *model_draft, struct engine_params *p,
                    struct weld_err *e)
{
    if (!json && !model_draft)
        return WELD_OK;
    if (json)
        return spec_config_parse_draft(json, model_draft, &p->spec, e);
    if (strlen(model_draft) >= sizeof p->spec.draft_model)
        return err_set(e, WELD_ERR_INVALID_ARG, "--model-draft: path too long");
    p->spec = (struct spec_config){.method = SPEC_DRAFT_MODEL, .num_tokens = 5};
    strcpy(p->spec.draft_model, model_draft);
    return WELD_OK;
}

int cli_engine_params(const struct cli_engine_opts *o, struct engine_params *out,
                      struct weld_err *e)
{
    struct engine_params p = engine_params_default();
    p.model_path = o->model;
    p.max_num_seqs = o->max_num_seqs;
    p.max_num_batched_tokens = o->max_num_batched_tokens;
    p.max_model_len = o->max_model_len;
    p.kv_cache_memory = o->kv_cache_memory;
    p.block_size = o->block_size;
    p.prefix_caching = !o->no_prefix_caching;
    p.jump_forward = !o->no_jump_forward;
    p.n_threads = o->threads;
    p.kv_offload_dir = o->kv_offload_dir;
    p.kv_offload_bytes = o->kv_offload_size;
    p.kv_store = o->kv_store;
    int rc = engine_parse_kv_dtype(o->kv_dtype, &p.kv_dtype, e);
    if (rc || (rc = cli_exec_tuning(&o->exec, &p.tuning, e)) ||
        (rc = cli_spec_params(o->spec_config, o->model_draft, &p, e)))
        return rc;
    if (!strcmp(o->policy, "fcfs"))
        p.policy = SCHED_POLICY_FCFS;
    else if (!strcmp(o->policy, "priority"))
        p.policy = SCHED_POLICY_PRIORITY;
    else
        return err_set(e, WELD_ERR_INVALID_ARG, "--policy '%s': expected fcfs or priority",
                       o->policy);
    *out = p;
    return WELD_OK;
}

int cli_engine_open(const struct cli_engine_opts *o, struct engine **eng, struct weld_err *e)
{
    struct engine_params p;
    int rc = cli_engine_params(o, &p, e);
    return rc ? rc : engine_create(eng, &p, e);
}

void cli_engine_summary(const struct engine *eng, double seconds, const char *what)
{
    struct engine_stats st;
    engine_stats_get(eng, &st);
    uint64_t tot = st.prompt_tokens + st.generated_tokens;
    fprintf(stderr,
            "weld %s: %llu requests run (%llu finished, %llu failed, %llu aborted), %llu "
            "refused, in %.2f s\n"
            "  prompt tokens %llu (cached %llu, hit rate %.1f%%), generated %llu\n"
            "  %.1f output tok/s, %.1f total tok/s; %llu steps, %llu preemptions, "
            "KV pool %d blocks (%.1f MiB)\n",
            what, (unsigned long long)st.requests_added, (unsigned long long)st.requests_finished,
            (unsigned long long)st.requests_failed, (unsigned long long)st.requests_aborted,
            (unsigned long long)st.requests_rejected, seconds,
            (unsigned long long)st.prompt_tokens, (unsigned long long)st.cached_tokens,
            st.prompt_tokens ? 100.0 * (double)st.cached_tokens / (double)st.prompt_tokens : 0.0,
            (unsigned long long)st.generated_tokens,
            seconds > 0 ? (double)st.generated_tokens / seconds : 0.0,
            seconds > 0 ? (double)tot / seconds : 0.0, (unsigned long long)st.steps,
            (unsigned long long)st.preemptions, st.kv_blocks,
            (double)st.kv_bytes / (1024.0 * 1024.0));
    if (st.tier_on) {
        const struct kvtier_stats *t = &st.tier;
        fprintf(stderr,
                "  kv tier: %llu of %llu tokens past the pool's hit loaded (%.1f%%), "
                "%llu blocks saved, %llu rejected, %llu errors, %llu dropped\n",
                (unsigned long long)st.tier_hit_tokens, (unsigned long long)st.tier_query_tokens,
                st.tier_query_tokens
                    ? 100.0 * (double)st.tier_hit_tokens / (double)st.tier_query_tokens
                    : 0.0,
                (unsigned long long)st.tier_blocks_saved,
                (unsigned long long)(t->t[KVTIER_FILE].rejects + t->t[KVTIER_STORE].rejects),
                (unsigned long long)(t->t[KVTIER_FILE].errors + t->t[KVTIER_STORE].errors),
                (unsigned long long)t->dropped);
    }
}

/* ---- results --------------------------------------------------------------------------- */

struct seq_out {
    char *text;
    size_t len, cap;
    json_t *token_ids, *logprobs;   /* arrays */
    struct request_result res;
    char *stop_reason;
    bool done;
};

struct line_out {
    json_t *id;                     /* the caller's id, or the line number */
    char *error;                    /* the line failed before it ran */
    struct seq_out *seqs;           /* (n) */
    int n, n_done;
    uint64_t rid;                   /* the engine's request id; 0: never queued */
    bool want_choices;
};

struct batch_run {
    struct line_out *lines;         /* (n_lines) */
    int n_lines, next_out;
    int *id_line;                   /* (n_lines + 1) engine request id -> line */
    FILE *out;
    struct progress prog;
    int n_errors;
    const char *chat_template;      /* --chat-template source for "messages", or NULL */
    struct schema_opts schema_opts; /* --structured-outputs-config */
};

static bool text_append(struct seq_out *s, const char *t, size_t n)
{
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + n + 1)
            cap *= 2;
        char *nb = wrealloc(s->text, cap);
        if (!nb)
            return false;
        s->text = nb;
        s->cap = cap;
    }
    memcpy(s->text + s->len, t, n);
    s->len += n;
    s->text[s->len] = 0;
    return true;
}

static struct seq_out *find_seq(struct batch_run *br, uint64_t id, int seq)
{
    if (id < 1 || id > (uint64_t)br->n_lines)
        return NULL;
    struct line_out *l = &br->lines[br->id_line[id]];
    return seq >= 0 && seq < l->n ? &l->seqs[seq] : NULL;
}

static void on_delta(void *user, uint64_t id, int seq, const char *text, size_t len,
                     const int32_t *tokens, int n_tokens, const struct request_logprob *lp)
{
    struct seq_out *s = find_seq(user, id, seq);
    if (!s)
        return;
    text_append(s, text, len);
    for (int i = 0; i < n_tokens; i++)
        json_array_append_new(s->token_ids, json_integer(tokens[i]));
    if (lp) {
        json_t *top = json_array();
        for (int k = 0; k < lp->n_top; k++)
            json_array_append_new(top, json_pack("{s:i, s:f}", "id", (int)lp->top_ids[k],
                                                 "logprob", (double)lp->top_logprobs[k]));
        json_array_append_new(s->logprobs, json_pack("{s:i, s:f, s:o}", "id", (int)lp->token,
                                                     "logprob", (double)lp->logprob,
                                                     "top_logprobs", top));
    }
}

static json_t *seq_json(const struct seq_out *s, int index)
{
    json_t *c = json_pack("{s:i, s:s%, s:s, s:O}", "index", index, "text",
                          s->text ? s->text : "", s->len,
                          "finish_reason", request_finish_str(s->res.finish), "token_ids",
                          s->token_ids);
    json_object_set_new(c, "stop_reason", s->stop_reason ? json_string(s->stop_reason)
                                          : s->res.stop_token >= 0 ? json_integer(s->res.stop_token)
                                                                   : json_null());
    if (json_array_size(s->logprobs))
        json_object_set(c, "logprobs", s->logprobs);
    if (s->res.finish == REQUEST_FINISH_ERROR && s->res.error)
        json_object_set_new(c, "error", json_string(s->res.error));
    return c;
}

/* The result object of a complete line. */
static json_t *line_json(const struct line_out *l)
{
    if (l->error)
        return json_pack("{s:O, s:s}", "id", l->id, "error", l->error);
    const struct seq_out *s0 = &l->seqs[0];
    json_t *o = json_object(), *c0 = seq_json(s0, 0);
    json_object_set(o, "id", l->id);
    json_object_del(c0, "index");
    json_object_del(c0, "logprobs");
    json_object_update(o, c0);
    json_decref(c0);
    int gen = 0;
    for (int i = 0; i < l->n; i++)
        gen += l->seqs[i].res.n_generated_tokens;
    json_object_set_new(o, "prompt_tokens", json_integer(s0->res.n_prompt_tokens));
    json_object_set_new(o, "cached_tokens", json_integer(s0->res.n_cached_tokens));
    json_object_set_new(o, "completion_tokens", json_integer(gen));
    json_object_set_new(o, "timings", json_pack("{s:f, s:f, s:f}", "queue_s", s0->res.t_queue,
                                                "ttft_s", s0->res.t_first_token, "total_s",
                                                s0->res.t_total));
    if (l->want_choices) {
        json_t *ch = json_array();
        for (int i = 0; i < l->n; i++)
            json_array_append_new(ch, seq_json(&l->seqs[i], i));
        json_object_set_new(o, "choices", ch);
    }
    return o;
}

static void line_release(struct line_out *l)
{
    for (int i = 0; l->seqs && i < l->n; i++) {
        wfree(l->seqs[i].text);
        wfree(l->seqs[i].stop_reason);
        json_decref(l->seqs[i].token_ids);
        json_decref(l->seqs[i].logprobs);
    }
    wfree(l->seqs);
    l->seqs = NULL;
    wfree(l->error);
    l->error = NULL;
    json_decref(l->id);
    l->id = NULL;
}

/* Write every complete line at the head of the output order. */
static void flush_lines(struct batch_run *br)
{
    while (br->next_out < br->n_lines) {
        struct line_out *l = &br->lines[br->next_out];
        if (!l->error && l->n_done < l->n)
            return;
        json_t *o = line_json(l);
        char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
        if (s) {
            fputs(s, br->out);
            fputc('\n', br->out);
            free(s);
        }
        json_decref(o);
        line_release(l);
        br->next_out++;
    }
}

static void on_finish(void *user, uint64_t id, int seq, const struct request_result *r)
{
    struct batch_run *br = user;
    struct seq_out *s = find_seq(br, id, seq);
    if (!s)
        return;
    s->res = *r;
    s->res.error = NULL;
    if (r->stop_reason)
        s->stop_reason = wstrdup(r->stop_reason);
    if (r->finish == REQUEST_FINISH_ERROR && r->error && !br->lines[br->id_line[id]].error)
        br->lines[br->id_line[id]].error = wstrdup(r->error); /* the first of its choices' */
    s->done = true;
    struct line_out *l = &br->lines[br->id_line[id]];
    if (++l->n_done == l->n) {
        progress_add(&br->prog, 1);
        if (l->error)
            br->n_errors++;
    }
    flush_lines(br);
}

/* ---- the command ----------------------------------------------------------------------- */

/* Parse and queue one input line (line_no counts from 1 for messages). */
static void add_line(struct engine *eng, struct batch_run *br, const char *text, size_t len,
                     int line_no)
{
    struct line_out *l = &br->lines[br->n_lines];
    int idx = br->n_lines++;
    struct weld_err e;
    struct batch_line bl;
    int rc = batch_line_parse(text, len, line_no, &br->schema_opts, &bl, &e);
    l->id = bl.id ? json_incref(bl.id) : json_integer(idx);
    uint64_t rid = 0;
    if (rc == WELD_OK) {
        struct request_callbacks cb = {br, on_delta, on_finish};
        bl.p.chat_template = br->chat_template;
        if ((rc = engine_add_request(eng, &bl.p, &cb, &rid, &e)))
            err_prefix(&e, "line %d", line_no);
    }
    if (rc == WELD_OK) {
        l->n = bl.p.n;
        l->want_choices = bl.p.n > 1 || bl.p.logprobs >= 0;
        l->seqs = wcalloc((size_t)l->n, sizeof *l->seqs);
        for (int i = 0; l->seqs && i < l->n; i++) {
            l->seqs[i].token_ids = json_array();
            l->seqs[i].logprobs = json_array();
        }
        br->id_line[rid] = idx;
        l->rid = rid;
        if (!l->seqs) {
            l->n = 0;
            engine_abort(eng, rid, NULL);
            rc = err_set(&e, WELD_ERR_NOMEM, "line %d: out of memory", line_no);
        }
    }
    if (rc != WELD_OK) {
        l->error = wstrdup(e.msg);
        l->n = 0;
    }
    batch_line_release(&bl);
}

/* The input, read whole before the model loads: its non-empty lines and their numbers. */
struct batch_input {
    char **text;    /* (n) NUL-terminated, trailing blanks and newline dropped */
    int *line_no;   /* (n) counting every line of the file from 1 */
    int n, n_good;  /* n_good: lines that parse as requests */
};

static void input_free(struct batch_input *in)
{
    for (int i = 0; i < in->n; i++)
        wfree(in->text[i]);
    wfree(in->text);
    wfree(in->line_no);
    memset(in, 0, sizeof *in);
}

/* Read the non-empty lines of path ("-": stdin) and parse each once: a file that cannot be
   read, has no request line, or has no line that parses fails here, before the model is
   loaded. Lines that fail alone get their error at their place in the output later. */
static int read_input(const char *path, struct batch_input *in, struct weld_err *e)
{
    char name[512]; /* how errors name the input */
    snprintf(name, sizeof name, strcmp(path, "-") ? "--input %s" : "standard input", path);
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
    if (!f)
        return err_set(e, WELD_ERR_IO, "%s: cannot open (%s)", name, strerror(errno));
    char *line = NULL, *first_err = NULL;
    size_t cap = 0;
    ssize_t n;
    int line_no = 0, cap_lines = 0, rc = WELD_OK;
    while ((n = getline(&line, &cap, f)) >= 0) {
        line_no++;
        size_t k = (size_t)n;
        while (k && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ' ||
                     line[k - 1] == '\t'))
            k--;
        if (!k)
            continue;
        if (in->n == cap_lines) {
            int nc = cap_lines ? cap_lines * 2 : 64;
            char **nt = wrealloc(in->text, (size_t)nc * sizeof *nt);
            if (nt)
                in->text = nt;
            int *nl = nt ? wrealloc(in->line_no, (size_t)nc * sizeof *nl) : NULL;
            if (nl)
                in->line_no = nl;
            if (!nt || !nl) {
                rc = err_set(e, WELD_ERR_NOMEM, "%s: out of memory at line %d", name,
                             line_no);
                break;
            }
            cap_lines = nc;
        }
        line[k] = 0;
        struct batch_line bl;
        struct weld_err le;
        if (batch_line_parse(line, k, line_no, NULL, &bl, &le) == WELD_OK)
            in->n_good++;
        else if (!first_err)
            first_err = wstrdup(le.msg);
        batch_line_release(&bl);
        in->line_no[in->n] = line_no;
        if (!(in->text[in->n++] = wstrndup(line, k))) {
            in->n--;
            rc = err_set(e, WELD_ERR_NOMEM, "%s: out of memory at line %d", name, line_no);
            break;
        }
    }
    if (rc == WELD_OK && ferror(f))
        rc = err_set(e, WELD_ERR_IO, "%s: read error (%s)", name, strerror(errno));
    if (rc == WELD_OK && in->n == 0)
        rc = err_set(e, WELD_ERR_FORMAT, "%s: no requests (not one non-empty line); give "
                     "one JSON object a line, e.g. {\"prompt\": \"Hello\", \"max_tokens\": 16}",
                     name);
    else if (rc == WELD_OK && in->n_good == 0)
        rc = err_set(e, WELD_ERR_FORMAT, "%s: none of its %d lines is a request "
                     "(%s); give one JSON object a line, e.g. {\"prompt\": \"Hello\", "
                     "\"max_tokens\": 16}", name, in->n, first_err ? first_err : "?");
    wfree(first_err);
    free(line);
    if (f != stdin)
        fclose(f);
    return rc;
}

/* Queue every line of the input (the model is loaded now). */
static int queue_input(struct engine *eng, struct batch_run *br, const struct batch_input *in,
                       struct weld_err *e)
{
    br->lines = wcalloc((size_t)in->n, sizeof *br->lines);
    br->id_line = wcalloc((size_t)in->n + 1, sizeof *br->id_line);
    if (!br->lines || !br->id_line)
        return err_set(e, WELD_ERR_NOMEM, "out of memory for %d lines", in->n);
    for (int i = 0; i < in->n; i++)
        add_line(eng, br, in->text[i], strlen(in->text[i]), in->line_no[i]);
    return WELD_OK;
}

static int batch_run_all(struct engine *eng, struct batch_run *br, struct weld_err *e)
{
    progress_start(&br->prog, "batch", (uint64_t)br->n_lines);
    int n_early = 0;
    for (int i = 0; i < br->n_lines; i++)
        n_early += br->lines[i].error != NULL;
    progress_add(&br->prog, (uint64_t)n_early);
    br->n_errors = n_early;
    flush_lines(br);
    int rc = WELD_OK, n_fail = 0;
    while (engine_has_work(eng)) {
        /* a failed step ends the requests it ran with "error"; the rest go on, unless the
           engine keeps failing: then everything left is aborted so every line is written */
        if ((rc = engine_step(eng, e)) == WELD_OK) {
            n_fail = 0;
            continue;
        }
        log_warn("step failed: %s", e->msg);
        if (++n_fail < 3)
            continue;
        for (int i = 0; i < br->n_lines; i++)
            if (br->lines[i].rid && br->lines[i].n_done < br->lines[i].n)
                engine_abort(eng, br->lines[i].rid, NULL);
        break;
    }
    progress_end(&br->prog);
    flush_lines(br);
    return rc;
}

int cmd_batch(int argc, char **argv)
{
    struct cli_engine_opts eo;
    cli_engine_opts_init(&eo);
    const char *input = NULL, *output = NULL, *chat_template = NULL, *so_config = NULL;
    struct cli_opt opts[CLI_ENGINE_N_OPTS + 4];
    int n_opts = cli_engine_opts_table(&eo, opts);
    opts[n_opts++] = (struct cli_opt){"input", 'i', OPT_STR, &input, "FILE",
                                      "requests, one JSON object a line ('-': stdin; required)"};
    opts[n_opts++] = (struct cli_opt){"output", 'o', OPT_STR, &output, "FILE",
                                      "results, one JSON object a line in input order "
                                      "(default: stdout)"};
    opts[n_opts++] = (struct cli_opt){"chat-template", 0, OPT_STR, &chat_template, "FILE|NAME",
                                      "Jinja chat template for \"messages\", or a builtin: chatml, "
                                      "llama2, llama3, mistral, qwen, gemma (default: the model's)"};
    opts[n_opts++] = (struct cli_opt){"structured-outputs-config",
                                      0,
                                      OPT_STR,
                                      &so_config,
                                      "JSON",
                                      "structured outputs, as vLLM: '{\"disable_any_whitespace\": "
                                      "true}'"};
    const char *pos[1];
    int n_pos;
    int prc = cli_parse(argc, argv, "batch -m MODEL --input requests.jsonl [--output results.jsonl] [options]",
                        "Run every request of a JSONL file through the engine (continuous batching,\n"
                        "prefix caching) and write one result per line in input order. A request has\n"
                        "\"prompt\", \"prompt_token_ids\" or \"messages\" and sampling parameters by their\n"
                        "OpenAI/vLLM names (max_tokens, temperature, top_p, top_k, stop, n, seed, ...).\n"
                        "The input is checked before the model loads. A line that fails gets\n"
                        "{\"id\", \"error\"} and the others run; the exit status is then 1.\n"
                        "A progress bar and a summary (lines succeeded and failed) go to stderr.",
                        opts, n_opts, pos, 0, &n_pos);
    if (prc)
        return prc == 1 ? 0 : 2;
    if (!eo.model || !input) {
        fprintf(stderr, "weld batch: -m MODEL and --input FILE are required (see --help)\n");
        return 2;
    }
    struct weld_err e;
    err_clear(&e);
    struct engine *eng = NULL;
    struct batch_run br;
    memset(&br, 0, sizeof br);
    br.out = stdout;
    struct batch_input in = {0};
    char *tmpl = NULL;
    int rc = chat_template ? chat_template_load(chat_template, &tmpl, &e) : WELD_OK;
    if (rc != WELD_OK)
        err_prefix(&e, "--chat-template");
    br.chat_template = tmpl;
    if (rc == WELD_OK && so_config)
        rc = cli_structured_outputs_config(so_config, &br.schema_opts, &e);
    if (rc == WELD_OK)
        rc = read_input(input, &in, &e); /* before the model: a bad file costs no load */
    if (rc == WELD_OK)
        rc = cli_engine_open(&eo, &eng, &e);
    if (rc == WELD_OK && output && !(br.out = fopen(output, "w")))
        rc = err_set(&e, WELD_ERR_IO, "--output %s: cannot create (%s)", output, strerror(errno));
    double t0 = time_now();
    if (rc == WELD_OK)
        rc = queue_input(eng, &br, &in, &e);
    if (rc == WELD_OK)
        rc = batch_run_all(eng, &br, &e);
    if (rc == WELD_OK) {
        cli_engine_summary(eng, time_now() - t0, "batch");
        fprintf(stderr, "weld batch: %d lines: %d succeeded, %d failed%s\n", br.n_lines,
                br.n_lines - br.n_errors, br.n_errors,
                br.n_errors ? " (their results carry \"error\"; exit status 1)" : "");
    } else {
        fprintf(stderr, "weld batch: %s\n", e.msg);
    }
    engine_free(eng);
    wfree(tmpl);
    for (int i = 0; i < br.n_lines; i++)
        line_release(&br.lines[i]);
    wfree(br.lines);
    wfree(br.id_line);
    input_free(&in);
    if (br.out && br.out != stdout && fclose(br.out) != 0 && rc == WELD_OK) {
        fprintf(stderr, "weld batch: --output %s: write error\n", output);
        rc = WELD_ERR_IO;
    }
    if (br.out == stdout && fflush(stdout) != 0 && rc == WELD_OK) {
        fprintf(stderr, "weld batch: standard output: write error\n");
        rc = WELD_ERR_IO;
    }
    return rc == WELD_OK && br.n_errors == 0 ? 0 : 1;
}
