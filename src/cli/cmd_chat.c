/*
 * cmd_chat - `weld chat MODEL` (also `weld generate -i`): a conversation in the terminal.
 *
 * Streams: each reply goes to stdout as it streams, followed by a newline; the banner,
 * the "> " prompt, notices and the --verbose per-turn statistics go to stderr. When stdin
 * is not a terminal there is no banner and no prompt: every line read is one user message
 * (a line ending in a backslash continues on the next), so the command is scriptable.
 *
 * History lives in the KV cache, not in a re-prefill: the conversation is kept as the
 * token ids the model has seen (prompts and its own sampled replies) plus the template
 * text those ids spell (hist_text). A new turn renders the whole conversation with the
 * chat template (add_generation_prompt) and, when hist_text is a prefix of it (the normal
 * case), encodes only the new tail (no BOS) and appends it to the history ids; the request
 * is those ids, so the engine's prefix cache (full blocks, hashed from the start) finds
 * every block of the earlier turns and computes only the new tokens. A template that does
 * not render the past identically (one that trims or rewrites old replies) falls back to
 * encoding the whole text; the cache then reuses whatever full blocks still match. A reply
 * that ended on an end-of-generation token keeps it out of the history ids: the template's
 * own end-of-turn text follows instead (the same token for a model's own template).
 *
 * Control: /clear forgets the conversation (the --system message stays), /exit, /quit
 * or end of input (Ctrl-D) quit with status 0. SIGINT (Ctrl-C) sets a flag; during a reply
 * the request is aborted after the current step and the conversation keeps what was said;
 * at the prompt a first Ctrl-C only says how to quit and a second in a row exits (130).
 * A turn that cannot fit in the context (--ctx) is refused with a notice suggesting /clear;
 * a reply that fills the context stops there with the same notice.
 */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/err.h"
#include "core/json.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct chat_opts {
    const char *model, *system, *chat_template, *prompt;
    int n_predict, ctx, threads;
    struct sampler_params sp;
    int64_t seed;
    bool ignore_eos, verbose, interactive;
    struct cli_exec_opts exec;
};

struct chat {
    const struct chat_opts *o;
    const char *cmd;                /* "chat" or "generate" (for messages) */
    struct engine *eng;
    const struct tokenizer *tok;
    struct chat_template *tmpl;
    json_t *msgs;                   /* the conversation: [{role, content}...] */
    int32_t *hist;                  /* (n_hist) ids the model has seen, in order */
    int n_hist, cap_hist;
    char *hist_text;                /* the template text hist spells (hist_len bytes) */
    size_t hist_len;
    int turn;
    /* the reply being generated */
    char *reply;
    size_t reply_len, reply_cap;
    int32_t *rtok;
    int n_rtok, cap_rtok;
    struct request_result res;
    char error[512];
    bool oom;
};

static volatile sig_atomic_t g_sigint;

static void on_sigint(int sig)
{
    (void)sig;
    g_sigint = 1;
}

static bool ids_reserve(int32_t **a, int *cap, int need)
{
    if (need <= *cap)
        return true;
    int nc = *cap ? *cap : 256;
    while (nc < need)
        nc *= 2;
    int32_t *na = wrealloc(*a, (size_t)nc * sizeof *na);
    if (!na)
        return false;
    *a = na;
    *cap = nc;
    return true;
}

static void on_delta(void *user, uint64_t req_id, int seq_index, const char *text, size_t len,
                     const int32_t *tokens, int n_tokens, const struct request_logprob *lp)
{
    struct chat *c = user;
    (void)req_id, (void)seq_index, (void)lp;
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        if (c->reply_len + len + 1 > c->reply_cap) {
            size_t nc = c->reply_cap ? c->reply_cap : 1024;
            while (nc < c->reply_len + len + 1)
                nc *= 2;
            char *nb = wrealloc(c->reply, nc);
            if (!nb) {
                c->oom = true;
                return;
            }
            c->reply = nb;
            c->reply_cap = nc;
        }
        memcpy(c->reply + c->reply_len, text, len);
        c->reply_len += len;
        c->reply[c->reply_len] = '\0';
    }
    if (n_tokens && !ids_reserve(&c->rtok, &c->cap_rtok, c->n_rtok + n_tokens)) {
        c->oom = true;
        return;
    }
    for (int i = 0; i < n_tokens; i++)
        c->rtok[c->n_rtok++] = tokens[i];
}

static void on_finish(void *user, uint64_t req_id, int seq_index,
                      const struct request_result *r)
{
    struct chat *c = user;
    (void)req_id, (void)seq_index;
    c->res = *r;
    if (r->error)
        snprintf(c->error, sizeof c->error, "%s", r->error);
    c->res.error = r->error ? c->error : NULL;
    c->res.stop_reason = NULL;
}

/* The whole conversation through the template, with the assistant's turn opened. */
static int render(struct chat *c, char **out, struct weld_err *e)
{
    json_t *ctx = json_object();
    json_object_set(ctx, "messages", c->msgs);
    json_object_set_new(ctx, "add_generation_prompt", json_true());
    const char *bos = tokenizer_bos_text(c->tok), *eos = tokenizer_eos_text(c->tok);
    if (bos)
        json_object_set_new(ctx, "bos_token", json_string(bos));
    if (eos)
        json_object_set_new(ctx, "eos_token", json_string(eos));
    int rc = chat_template_render(c->tmpl, ctx, out, NULL, e);
    json_decref(ctx);
    return rc;
}

static void clear_history(struct chat *c)
{
    json_array_clear(c->msgs);
    if (c->o->system)
        json_array_append_new(c->msgs, json_pack("{s:s, s:s}", "role", "system", "content",
                                                 c->o->system));
    c->n_hist = 0;
    c->hist_len = 0;
    wfree(c->hist_text);
    c->hist_text = NULL;
}

static void notice_full(const struct chat *c, int n_tokens)
{
    fprintf(stderr, "weld %s: the conversation fills the context (%d of %d tokens): type /clear "
                    "to start a new one, or run with a larger --ctx\n",
            c->cmd, n_tokens, c->o->ctx);
}

/*
 * The prompt ids of the next turn (the conversation rendered in *full): the history ids
 * plus the encoded new tail, or the whole text encoded. *reencoded: the fallback was taken.
 */
static int turn_prompt(struct chat *c, const char *full, int32_t **ids, int *n_ids,
                       bool *reencoded, struct weld_err *e)
{
    size_t n_full = strlen(full), n = 0;
    int32_t *enc = NULL;
    int rc;
    *reencoded = false;
    if (c->n_hist && c->hist_len <= n_full && !memcmp(full, c->hist_text, c->hist_len)) {
        if ((rc = tokenizer_encode(c->tok, full + c->hist_len, n_full - c->hist_len, false,
                                   true, &enc, &n, e)))
            return rc;
        int32_t *all = wmalloc(((size_t)c->n_hist + n + 1) * sizeof *all);
        if (!all) {
            wfree(enc);
            return err_set(e, WELD_ERR_NOMEM, "out of memory");
        }
        memcpy(all, c->hist, (size_t)c->n_hist * sizeof *all);
        if (n)
            memcpy(all + c->n_hist, enc, n * sizeof *all);
        wfree(enc);
        *ids = all;
        *n_ids = c->n_hist + (int)n;
        return WELD_OK;
    }
    *reencoded = c->n_hist > 0;
    const char *bos = tokenizer_bos_text(c->tok);
    bool add_special = !(bos && *bos && !strncmp(full, bos, strlen(bos)));
    if ((rc = tokenizer_encode(c->tok, full, n_full, add_special, true, &enc, &n, e)))
        return rc;
    if (n == 0 || n > (size_t)INT32_MAX / 2) {
        wfree(enc);
        return err_set(e, WELD_ERR_INVALID_ARG, "the message encodes to %zu tokens", n);
    }
    *ids = enc;
    *n_ids = (int)n;
    return WELD_OK;
}

/* One user message -> one streamed reply. Returns non-OK only for engine failures (fatal);
 * a message that cannot be sent is reported and forgotten. */
static int chat_turn(struct chat *c, const char *text, struct weld_err *fatal)
{
    struct weld_err e;
    err_clear(&e);
    json_t *um = json_pack("{s:s, s:s}", "role", "user", "content", text);
    if (!um || json_array_append_new(c->msgs, um)) {
        fprintf(stderr, "weld %s: the message is not valid UTF-8; not sent\n", c->cmd);
        return WELD_OK;
    }
    char *full = NULL;
    int32_t *ids = NULL;
    int n_ids = 0, rc;
    bool reencoded = false;
    if ((rc = render(c, &full, &e)) == WELD_OK)
        rc = turn_prompt(c, full, &ids, &n_ids, &reencoded, &e);
    if (rc == WELD_OK && n_ids >= c->o->ctx) {
        notice_full(c, n_ids);
        rc = WELD_ERR_LIMIT;
    } else if (rc != WELD_OK) {
        fprintf(stderr, "weld %s: %s\n", c->cmd, e.msg);
    }
    if (rc != WELD_OK) {
        json_array_remove(c->msgs, json_array_size(c->msgs) - 1);
        wfree(full);
        wfree(ids);
        return WELD_OK;
    }

    struct request_params rp = request_params_default();
    rp.prompt_ids = ids;
    rp.n_prompt_ids = n_ids;
    rp.sampling = c->o->sp;
    rp.sampling.seed = c->o->sp.seed + (uint64_t)c->turn;
    rp.has_seed = true;
    rp.max_tokens = c->o->n_predict > 0 && c->o->n_predict < c->o->ctx - n_ids
                        ? c->o->n_predict
                        : c->o->ctx - n_ids;
    rp.ignore_eos = c->o->ignore_eos;
    c->reply_len = 0;
    c->n_rtok = 0;
    c->oom = false;
    memset(&c->res, 0, sizeof c->res);
    struct request_callbacks cb = {.user = c, .on_delta = on_delta, .on_finish = on_finish};
    uint64_t id = 0;
    bool stopped = false;
    g_sigint = 0;
    rc = engine_add_request(c->eng, &rp, &cb, &id, fatal);
    while (rc == WELD_OK && engine_has_work(c->eng)) {
        if (g_sigint && !stopped) {
            g_sigint = 0;
            stopped = true;
            engine_abort(c->eng, id, NULL);
            continue;
        }
        rc = engine_step(c->eng, fatal);
    }
    g_sigint = 0;
    fputc('\n', stdout);
    fflush(stdout);
    c->turn++;
    if (rc == WELD_OK && c->oom)
        rc = err_set(fatal, WELD_ERR_NOMEM, "out of memory");
    if (rc == WELD_OK && c->res.finish == REQUEST_FINISH_ERROR)
        rc = err_set(fatal, WELD_ERR_INTERNAL, "%s", c->res.error ? c->res.error : "failed");
    if (rc != WELD_OK) {
        wfree(full);
        wfree(ids);
        return rc;
    }

    /* the history: prompt ids + reply ids (less a final end-of-generation token), and the
       template text they spell; the reply joins the conversation as the assistant's turn */
    int n_keep = c->n_rtok;
    if (c->res.finish == REQUEST_FINISH_STOP && c->res.stop_token >= 0 && n_keep &&
        c->rtok[n_keep - 1] == c->res.stop_token)
        n_keep--;
    size_t n_full = strlen(full);
    char *ht = wmalloc(n_full + c->reply_len + 1);
    if (!ht || !ids_reserve(&c->hist, &c->cap_hist, n_ids + n_keep)) {
        wfree(ht);
        wfree(full);
        wfree(ids);
        return err_set(fatal, WELD_ERR_NOMEM, "out of memory");
    }
    memcpy(c->hist, ids, (size_t)n_ids * sizeof *ids);
    memcpy(c->hist + n_ids, c->rtok, (size_t)n_keep * sizeof *ids);
    c->n_hist = n_ids + n_keep;
    memcpy(ht, full, n_full);
    if (c->reply_len)
        memcpy(ht + n_full, c->reply, c->reply_len);
    ht[n_full + c->reply_len] = '\0';
    wfree(c->hist_text);
    c->hist_text = ht;
    c->hist_len = n_full + c->reply_len;
    json_t *am = json_pack("{s:s, s:s%}", "role", "assistant", "content",
                           c->reply ? c->reply : "", c->reply_len);
    if (!am || json_array_append_new(c->msgs, am))
        return err_set(fatal, WELD_ERR_NOMEM, "out of memory");

    const struct request_result *r = &c->res;
    if (c->o->verbose) {
        double t_dec = r->t_total - r->t_first_token;
        int n_gen = r->n_generated_tokens;
        fprintf(stderr,
                "weld %s: turn %d: prompt %d tokens (%d cached, %d computed%s), reply %d tokens "
                "in %.2f s (%.1f tok/s), %s, context %d of %d\n",
                c->cmd, c->turn, r->n_prompt_tokens, r->n_cached_tokens,
                r->n_prompt_tokens - r->n_cached_tokens, reencoded ? ", history re-encoded" : "",
                n_gen, r->t_total, n_gen > 1 && t_dec > 0 ? (n_gen - 1) / t_dec : 0.0,
                stopped ? "stopped" : request_finish_str(r->finish), n_ids + c->n_rtok,
                c->o->ctx);
    }
    if (stopped)
        fprintf(stderr, "[stopped]\n");
    else if (r->finish == REQUEST_FINISH_LENGTH && n_ids + c->n_rtok >= c->o->ctx)
        notice_full(c, n_ids + c->n_rtok);
    wfree(full);
    wfree(ids);
    return WELD_OK;
}

/* Read one message: lines joined while they end in a backslash. Returns 1 with *msg set
 * (wmalloc'd, no newline), 0 at end of input, -1 when Ctrl-C interrupted the read. */
static int read_message(char **msg, bool tty)
{
    char *line = NULL, *acc = NULL;
    size_t cap = 0, n_acc = 0;
    *msg = NULL;
    for (;;) {
        if (g_sigint) {
            free(line);
            wfree(acc);
            return -1;
        }
        errno = 0;
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) {
            bool intr = g_sigint || errno == EINTR;
            clearerr(stdin);
            free(line);
            if (intr) {
                wfree(acc);
                return -1;
            }
            if (!acc)
                return 0;
            *msg = acc; /* the last line ended in a backslash, then the input did */
            return 1;
        }
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            n--;
        bool more = n && line[n - 1] == '\\';
        if (more)
            n--;
        char *na = wrealloc(acc, n_acc + (size_t)n + 2);
        if (!na) {
            free(line);
            wfree(acc);
            return 0;
        }
        acc = na;
        memcpy(acc + n_acc, line, (size_t)n);
        n_acc += (size_t)n;
        if (more)
            acc[n_acc++] = '\n';
        acc[n_acc] = '\0';
        if (!more) {
            free(line);
            *msg = acc;
            return 1;
        }
        if (tty)
            fputs(". ", stderr);
    }
}

static bool is_cmd(const char *s, const char *cmd)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(cmd);
    if (strncmp(s, cmd, n))
        return false;
    for (s += n; *s; s++)
        if (*s != ' ' && *s != '\t')
            return false;
    return true;
}

static int chat_loop(struct chat *c, struct weld_err *e)
{
    bool tty = isatty(STDIN_FILENO);
    int n_intr = 0, rc = WELD_OK;
    if (c->o->prompt && (rc = chat_turn(c, c->o->prompt, e)))
        return rc;
    for (;;) {
        if (tty) {
            fputs("> ", stderr);
            fflush(stderr);
        }
        char *msg = NULL;
        int got = read_message(&msg, tty);
        if (got < 0) {
            g_sigint = 0;
            if (++n_intr >= 2) {
                if (tty)
                    fputc('\n', stderr);
                return -1;
            }
            fprintf(stderr, "\n(Ctrl-C again, /exit or Ctrl-D to quit)\n");
            continue;
        }
        if (got == 0) {
            if (tty)
                fputc('\n', stderr);
            return WELD_OK;
        }
        n_intr = 0;
        if (is_cmd(msg, "/exit") || is_cmd(msg, "/quit")) {
            wfree(msg);
            return WELD_OK;
        }
        if (is_cmd(msg, "/clear")) {
            clear_history(c);
            fprintf(stderr, "(conversation cleared)\n");
        } else if (is_cmd(msg, "/help")) {
            fprintf(stderr, "/clear  start a new conversation (the --system message stays)\n"
                            "/exit   quit (also /quit, Ctrl-D, or Ctrl-C twice at the prompt)\n"
                            "Ctrl-C during a reply stops it; a line ending in \\ continues on "
                            "the next\n");
        } else if (msg[strspn(msg, " \t\n")]) {
            rc = chat_turn(c, msg, e);
        }
        wfree(msg);
        if (rc != WELD_OK)
            return rc;
    }
}

int cmd_chat(int argc, char **argv)
{
    struct chat_opts o = {.n_predict = -1, .ctx = 0, .seed = -1};
    o.sp = sampler_params_default();
    o.sp.temperature = 0.8f;
    o.sp.top_k = 40;
    o.sp.top_p = 0.95f;
    o.sp.min_p = 0.05f;
    const struct cli_opt base[] = {
        {"model", 'm', OPT_STR, &o.model, "MODEL", "GGUF file or Hugging Face directory (or give it as the argument)"},
        {"system", 0, OPT_STR, &o.system, "TEXT", "system message, kept across /clear"},
        {"chat-template", 0, OPT_STR, &o.chat_template, "FILE|NAME", "Jinja chat template file or a builtin: chatml, llama2, llama3, mistral, qwen, gemma (default: the model's)"},
        {"prompt", 'p', OPT_STR, &o.prompt, "TEXT", "first user message, sent before reading any input"},
        {"n-predict", 'n', OPT_INT, &o.n_predict, "N", "most tokens per reply; -1 = until the reply ends or the context is full (default)"},
        {"ctx", 'c', OPT_INT, &o.ctx, "N", "context length, the whole conversation (default: the model's, at most 4096)"},
        {"temp", 0, OPT_FLOAT, &o.sp.temperature, "T", "temperature; 0 = greedy (default 0.8)"},
        {"top-k", 0, OPT_INT, &o.sp.top_k, "K", "keep the K most likely tokens; 0 = off (default 40)"},
        {"top-p", 0, OPT_FLOAT, &o.sp.top_p, "P", "nucleus sampling mass; 1 = off (default 0.95)"},
        {"min-p", 0, OPT_FLOAT, &o.sp.min_p, "P", "drop tokens below P x the top probability; 0 = off (default 0.05)"},
        {"repeat-penalty", 0, OPT_FLOAT, &o.sp.repetition_penalty, "R", "repetition penalty; 1 = off (default 1)"},
        {"seed", 's', OPT_I64, &o.seed, "S", "random seed (default: random)"},
        {"ignore-eos", 0, OPT_FLAG, &o.ignore_eos, NULL, "do not end a reply at end-of-generation tokens"},
        {"threads", 't', OPT_INT, &o.threads, "N", "forward-pass threads (default: one per physical core)"},
        {"verbose", 'v', OPT_FLAG, &o.verbose, NULL, "after each reply, print its statistics to stderr (prompt tokens, cached, speed)"},
        {"interactive", 'i', OPT_FLAG, &o.interactive, NULL, "accepted for `weld generate -i` (always on)"},
    };
    enum { N_BASE = sizeof base / sizeof base[0] };
    struct cli_opt opts[N_BASE + CLI_EXEC_N_OPTS];
    memcpy(opts, base, sizeof base);
    int n_opts = N_BASE + cli_exec_opts_table(&o.exec, opts + N_BASE);
    const char *cmd = argc > 0 && !strcmp(argv[0], "generate") ? "generate" : "chat";
    const char *pos[1];
    int n_pos;
    int prc = cli_parse(argc, argv, "chat MODEL [options]   (or: weld generate -i -m MODEL)",
                        "Chat with a model in the terminal, through its chat template. Replies stream\n"
                        "to stdout; the prompt and notices go to stderr. The conversation stays in the\n"
                        "KV cache, so each turn computes only its new tokens. /clear starts over,\n"
                        "/exit or Ctrl-D quits, Ctrl-C stops a reply. When stdin is not a terminal,\n"
                        "each line is one message.",
                        opts, n_opts, pos, 1, &n_pos);
    if (prc)
        return prc == 1 ? 0 : 2;
    if (n_pos && o.model && strcmp(pos[0], o.model)) {
        fprintf(stderr, "weld %s: two models given ('%s' and -m '%s')\n", cmd, pos[0], o.model);
        return 2;
    }
    if (n_pos)
        o.model = pos[0];
    if (!o.model) {
        fprintf(stderr, "weld %s: a model is required: weld chat MODEL (see --help)\n", cmd);
        return 2;
    }
    if (o.n_predict == 0 || o.n_predict < -1 || o.ctx < 0 || o.threads < 0) {
        fprintf(stderr, "weld %s: -n must be -1 or at least 1; --ctx and --threads must not be "
                        "negative\n", cmd);
        return 2;
    }
    o.sp.seed = o.seed >= 0 ? (uint64_t)o.seed
                            : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);

    struct weld_err e;
    err_clear(&e);
    struct model *m = NULL;
    struct chat c = {.o = &o, .cmd = cmd};
    char *tmpl_src = NULL;
    int rc = sampler_params_check(&o.sp, &e);
    if (rc == WELD_OK && o.chat_template &&
        (rc = chat_template_load(o.chat_template, &tmpl_src, &e)))
        err_prefix(&e, "--chat-template");
    struct exec_tuning tuning;
    if (rc == WELD_OK)
        rc = cli_exec_tuning(&o.exec, &tuning, &e);
    if (rc == WELD_OK)
        rc = model_load(&m, o.model, &e);
    if (rc == WELD_OK) {
        if (o.ctx == 0)
            o.ctx = m->cfg.max_ctx > 0 && m->cfg.max_ctx < 4096 ? m->cfg.max_ctx : 4096;
        struct engine_params ep = engine_params_default();
        ep.model = m;
        ep.max_num_seqs = 1;
        ep.max_model_len = o.ctx;
        ep.quiet = true;
        ep.n_threads = o.threads;
        ep.tuning = tuning;
        rc = engine_create(&c.eng, &ep, &e);
    }
    if (rc == WELD_OK) {
        c.tok = engine_tokenizer(c.eng);
        const char *src = tmpl_src ? tmpl_src : c.tok ? tokenizer_chat_template(c.tok) : NULL;
        if (!c.tok)
            rc = err_set(&e, WELD_ERR_NOT_FOUND, "%s has no tokenizer", o.model);
        else if (!src)
            rc = err_set(&e, WELD_ERR_NOT_FOUND,
                         "%s has no chat template: give one with --chat-template FILE or a "
                         "builtin name (%s)", o.model, chat_template_builtin_names());
        else
            rc = chat_template_parse(&c.tmpl, src, strlen(src), &e);
    }
    if (rc == WELD_OK && !(c.msgs = json_array()))
        rc = err_set(&e, WELD_ERR_NOMEM, "out of memory");
    if (rc == WELD_OK) {
        /* a template that refuses this conversation's shape (a system message where it
           has no system role, say) fails now, before the banner */
        clear_history(&c);
        json_array_append_new(c.msgs, json_pack("{s:s, s:s}", "role", "user", "content", "Hi"));
        char *probe = NULL;
        rc = render(&c, &probe, &e);
        wfree(probe);
    }
    if (rc != WELD_OK) {
        fprintf(stderr, "weld %s: %s\n", cmd, e.msg);
        json_decref(c.msgs);
        chat_template_free(c.tmpl);
        wfree(c.hist_text);
        wfree(tmpl_src);
        engine_free(c.eng);
        model_free(m);
        return 1;
    }
    clear_history(&c);

    struct sigaction sa, old_sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a Ctrl-C at the prompt interrupts the read */
    sigaction(SIGINT, &sa, &old_sa);
    if (isatty(STDIN_FILENO)) {
        fprintf(stderr, "weld %s: %s, context %d tokens, template %s", cmd, o.model, o.ctx,
                o.chat_template ? o.chat_template : "from the model");
        if (o.sp.temperature > 0)
            fprintf(stderr, ", seed %llu", (unsigned long long)o.sp.seed);
        fprintf(stderr, "\n  Type a message and press Enter; /clear starts over, /exit or Ctrl-D "
                        "quits, Ctrl-C stops a reply, /help for more.\n");
    }
    rc = chat_loop(&c, &e);
    sigaction(SIGINT, &old_sa, NULL);
    if (rc > 0)
        fprintf(stderr, "weld %s: %s\n", cmd, e.msg);

    json_decref(c.msgs);
    chat_template_free(c.tmpl);
    wfree(c.hist);
    wfree(c.hist_text);
    wfree(c.reply);
    wfree(c.rtok);
    wfree(tmpl_src);
    engine_free(c.eng);
    model_free(m);
    return rc == 0 ? 0 : rc < 0 ? 130 : 1;
}
