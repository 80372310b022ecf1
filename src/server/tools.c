/*
 * tools - see tools.h. The parsers read JSON values in place with jansson's
 * JSON_DISABLE_EOF_CHECK (it reports how many bytes the value took), so a call's end is
 * wherever its JSON ends, whatever follows.
 */
#include "server/tools.h"

#include "core/alloc.h"
#include "grammar/schema.h"
#include "server/openai.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    enum tool_parser p;
} parsers[] = {
    {"hermes", TOOL_PARSER_HERMES},           {"qwen", TOOL_PARSER_HERMES},
    {"llama3_json", TOOL_PARSER_LLAMA3_JSON}, {"mistral", TOOL_PARSER_MISTRAL},
    {"deepseek_v3", TOOL_PARSER_DEEPSEEK_V3},
};

bool tool_parser_from_name(const char *name, enum tool_parser *p)
{
    for (size_t i = 0; i < sizeof parsers / sizeof parsers[0]; i++)
        if (!strcmp(parsers[i].name, name)) {
            *p = parsers[i].p;
            return true;
        }
    return false;
}

const char *tool_parser_names(void)
{
    return "hermes, qwen, llama3_json, mistral, deepseek_v3";
}

#define DS_CALLS_BEGIN                                                                             \
    "<\xef\xbd\x9ctool\xe2\x96\x81"                                                                \
    "calls\xe2\x96\x81"                                                                            \
    "begin\xef\xbd\x9c>"
#define DS_CALL_BEGIN                                                                              \
    "<\xef\xbd\x9ctool\xe2\x96\x81"                                                                \
    "call\xe2\x96\x81"                                                                             \
    "begin\xef\xbd\x9c>"
#define DS_CALL_END                                                                                \
    "<\xef\xbd\x9ctool\xe2\x96\x81"                                                                \
    "call\xe2\x96\x81"                                                                             \
    "end\xef\xbd\x9c>"
#define DS_SEP                                                                                     \
    "<\xef\xbd\x9ctool\xe2\x96\x81"                                                                \
    "sep\xef\xbd\x9c>"

/* ---- the request ---------------------------------------------------------------------- */

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (!n || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

/* Rewrite the $refs of function i's parameters p (moved under the root's $defs as
   "f<i>"; its own $defs / definitions as "f<i>_<name>") so they resolve from the root. */
static void rewrite_refs(json_t *v, int i)
{
    if (json_is_array(v)) {
        size_t k;
        json_t *x;
        json_array_foreach(v, k, x) rewrite_refs(x, i);
        return;
    }
    if (!json_is_object(v))
        return;
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x)
    {
        if (!strcmp(key, "$ref") && json_is_string(x)) {
            const char *r = json_string_value(x);
            char buf[512];
            if (!strcmp(r, "#"))
                snprintf(buf, sizeof buf, "#/$defs/f%d", i);
            else if (!strncmp(r, "#/$defs/", 8))
                snprintf(buf, sizeof buf, "#/$defs/f%d_%s", i, r + 8);
            else if (!strncmp(r, "#/definitions/", 14))
                snprintf(buf, sizeof buf, "#/$defs/f%d_%s", i, r + 14);
            else
                continue; /* the schema compiler names what it cannot resolve */
            json_object_set_new(v, key, json_string(buf));
        } else {
            rewrite_refs(x, i);
        }
    }
}

static json_t *params_of(const json_t *fn)
{
    const json_t *p = json_object_get(fn, "parameters");
    return json_is_object(p) ? json_deep_copy(p) : json_pack("{s:s}", "type", "object");
}

static int compile_schema(json_t *schema, const char *field, const struct schema_opts *opts,
                          char **gbnf, struct server_error *e)
{
    char *txt = json_dumps(schema, JSON_COMPACT);
    if (!txt)
        return server_error_set(e, 500, NULL, "out of memory");
    struct weld_err we = {0};
    int rc = grammar_gbnf_json_schema_ex(txt, strlen(txt), "root", opts, gbnf, &we);
    free(txt);
    if (rc)
        return server_error_set(e, rc == WELD_ERR_NOMEM ? 500 : 400, "tools", "field '%s': %s",
                                field, we.msg);
    return 0;
}

/* The grammar of "required": [{"name": NAME, "parameters": {..}}, ...]. */
static int required_gbnf(const json_t *tools, bool parallel, const struct schema_opts *opts,
                         char **gbnf, struct server_error *e)
{
    json_t *alts = json_array(), *defs = json_object();
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t)
    {
        const json_t *fn = json_object_get(t, "function");
        json_t *p = params_of(fn);
        /* hoist its definitions, then the parameters themselves (for "#") */
        const char *dk[] = {"$defs", "definitions"};
        for (int k = 0; k < 2; k++) {
            json_t *d = json_object_get(p, dk[k]);
            const char *name;
            json_t *x;
            json_object_foreach(d, name, x)
            {
                char key[300];
                snprintf(key, sizeof key, "f%zu_%s", i, name);
                json_t *c = json_deep_copy(x);
                rewrite_refs(c, (int)i);
                json_object_set_new(defs, key, c);
            }
            json_object_del(p, dk[k]);
        }
        rewrite_refs(p, (int)i);
        char key[32];
        snprintf(key, sizeof key, "f%zu", i);
        json_object_set(defs, key, p);
        json_array_append_new(alts, json_pack("{s:s, s:{s:{s:s}, s:o}, s:[s, s], s:b}", "type",
                                              "object", "properties", "name", "const",
                                              json_string_value(json_object_get(fn, "name")),
                                              "parameters", p, "required", "name", "parameters",
                                              "additionalProperties", 0));
    }
    json_t *schema = json_pack("{s:s, s:i, s:{s:o}, s:o}", "type", "array", "minItems", 1, "items",
                               "anyOf", alts, "$defs", defs);
    if (!parallel)
        json_object_set_new(schema, "maxItems", json_integer(1));
    int rc = compile_schema(schema, "tools", opts, gbnf, e);
    json_decref(schema);
    return rc;
}

int server_tools_parse(const json_t *body, enum tool_parser parser, bool auto_ok,
                       const struct schema_opts *opts, struct server_tools *t,
                       struct server_error *e)
{
    memset(t, 0, sizeof *t);
    t->parallel = true;
    t->parser = parser;
    const json_t *tools = json_object_get(body, "tools");
    const json_t *tc = json_object_get(body, "tool_choice");
    const json_t *par = json_object_get(body, "parallel_tool_calls");
    if (par && !json_is_null(par)) {
        if (!json_is_boolean(par))
            return server_error_set(e, 400, "parallel_tool_calls",
                                    "field 'parallel_tool_calls': expected a boolean");
        t->parallel = json_is_true(par);
    }
    const bool have = tools && !json_is_null(tools);
    if (have && !json_is_array(tools))
        return server_error_set(e, 400, "tools",
                                "field 'tools': expected an array of "
                                "{\"type\": \"function\", \"function\": {...}}");
    size_t n = have ? json_array_size(tools) : 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(tools, i);
        const json_t *ty = json_object_get(x, "type");
        const json_t *fn = json_object_get(x, "function");
        const json_t *nm = json_object_get(fn, "name");
        const json_t *pa = json_object_get(fn, "parameters");
        if (!json_is_object(x) || !json_is_string(ty) || strcmp(json_string_value(ty), "function"))
            return server_error_set(e, 400, "tools",
                                    "field 'tools[%zu].type': expected "
                                    "\"function\"",
                                    i);
        if (!json_is_object(fn))
            return server_error_set(e, 400, "tools",
                                    "field 'tools[%zu].function': expected "
                                    "an object",
                                    i);
        if (!json_is_string(nm) || !name_ok(json_string_value(nm)))
            return server_error_set(e, 400, "tools",
                                    "field 'tools[%zu].function.name': "
                                    "expected 1 to 64 letters, digits, '_', '-' or '.'",
                                    i);
        if (pa && !json_is_null(pa) && !json_is_object(pa))
            return server_error_set(e, 400, "tools",
                                    "field 'tools[%zu].function.parameters': "
                                    "expected a JSON Schema object",
                                    i);
    }
    const char *choice = n ? "auto" : "none";
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            choice = json_string_value(tc);
            if (strcmp(choice, "none") && strcmp(choice, "auto") && strcmp(choice, "required"))
                return server_error_set(e, 400, "tool_choice",
                                        "field 'tool_choice': expected "
                                        "\"none\", \"auto\", \"required\" or {\"type\": "
                                        "\"function\", \"function\": {\"name\": ...}}");
        } else {
            const json_t *nm = json_object_get(json_object_get(tc, "function"), "name");
            if (!json_is_object(tc) || !json_is_string(nm))
                return server_error_set(e, 400, "tool_choice",
                                        "field 'tool_choice': expected "
                                        "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            choice = NULL;
            size_t i = 0;
            for (; i < n; i++)
                if (!strcmp(json_string_value(json_object_get(
                                json_object_get(json_array_get(tools, i), "function"), "name")),
                            json_string_value(nm)))
                    break;
            if (i == n)
                return server_error_set(e, 400, "tool_choice",
                                        "field 'tool_choice': no tool "
                                        "named '%s' in 'tools'",
                                        json_string_value(nm));
            t->choice = TOOL_CHOICE_NAMED;
            if (!(t->named = wstrdup(json_string_value(nm))))
                return server_error_set(e, 500, NULL, "out of memory");
            json_t *p = params_of(json_object_get(json_array_get(tools, i), "function"));
            char field[64];
            snprintf(field, sizeof field, "tools[%zu].function.parameters", i);
            int rc = compile_schema(p, field, opts, &t->gbnf, e);
            json_decref(p);
            return rc;
        }
    }
    if (!strcmp(choice, "none"))
        return 0;
    if (!n)
        return server_error_set(e, 400, "tool_choice",
                                "field 'tool_choice': \"%s\" needs "
                                "'tools'",
                                choice);
    /* each function's parameters compile on their own: errors name the tool */
    for (size_t i = 0; i < n; i++) {
        json_t *p = params_of(json_object_get(json_array_get(tools, i), "function"));
        char field[64], *g = NULL;
        snprintf(field, sizeof field, "tools[%zu].function.parameters", i);
        int rc = compile_schema(p, field, opts, &g, e);
        json_decref(p);
        wfree(g);
        if (rc)
            return rc;
    }
    if (!strcmp(choice, "required")) {
        t->choice = TOOL_CHOICE_REQUIRED;
        return required_gbnf(tools, t->parallel, opts, &t->gbnf, e);
    }
    if (!auto_ok || parser == TOOL_PARSER_NONE)
        return server_error_set(e, 400, "tool_choice",
                                "\"auto\" tool choice requires "
                                "--enable-auto-tool-choice and --tool-call-parser to be set "
                                "(or give tool_choice \"none\", \"required\" or a function)");
    t->choice = TOOL_CHOICE_AUTO;
    return 0;
}

void server_tools_release(struct server_tools *t)
{
    wfree(t->named);
    wfree(t->gbnf);
    memset(t, 0, sizeof *t);
}

/* ---- reading calls out of text -------------------------------------------------------- */

static void free_fields(struct tool_call *c, int n)
{
    for (int i = 0; c && i < n; i++) {
        wfree(c[i].name);
        wfree(c[i].arguments);
    }
}

struct calls {
    struct tool_call *c;
    int n, cap;
    bool bad;
};

/* A call named name[0, name_len) (a function name: name_ok; anything else is not a call:
   false) with arguments args. */
static bool add_call(struct calls *cs, const char *name, size_t name_len, const json_t *args)
{
    char nb[65];
    if (!name_len || name_len > 64)
        return false;
    memcpy(nb, name, name_len);
    nb[name_len] = 0;
    if (!name_ok(nb))
        return false;
    if (cs->n == cs->cap) {
        int cap = cs->cap ? cs->cap * 2 : 4;
        struct tool_call *nc = wrealloc(cs->c, (size_t)cap * sizeof *nc);
        if (!nc) {
            cs->bad = true;
            return false;
        }
        cs->c = nc, cs->cap = cap;
    }
    char *a = args ? json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    char *aw = wstrdup(a ? a : "{}");
    free(a);
    char *nm = wstrndup(name, name_len);
    if (!aw || !nm) {
        wfree(aw), wfree(nm);
        cs->bad = true;
        return false;
    }
    cs->c[cs->n++] = (struct tool_call){nm, aw};
    return true;
}

static size_t skip_ws(const char *s, size_t len, size_t p)
{
    while (p < len && (s[p] == ' ' || s[p] == '\n' || s[p] == '\r' || s[p] == '\t'))
        p++;
    return p;
}

static bool starts(const char *s, size_t len, size_t p, const char *lit)
{
    size_t n = strlen(lit);
    return p + n <= len && !memcmp(s + p, lit, n);
}

static size_t find(const char *s, size_t len, size_t from, const char *lit)
{
    size_t n = strlen(lit);
    for (size_t p = from; p + n <= len; p++)
        if (!memcmp(s + p, lit, n))
            return p;
    return (size_t)-1;
}

/* The JSON value at s[p, len) (taken: its bytes), or NULL. */
static json_t *json_at(const char *s, size_t len, size_t p, size_t *taken)
{
    json_error_t je;
    json_t *v = json_loadb(s + p, len - p, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &je);
    if (v)
        *taken = (size_t)je.position;
    return v;
}

/* {"name": .., "arguments" | "parameters": ..} -> a call. */
static bool call_object(struct calls *cs, const json_t *o)
{
    const json_t *nm = json_object_get(o, "name");
    if (!json_is_object(o) || !json_is_string(nm) || !json_string_length(nm))
        return false;
    const json_t *a = json_object_get(o, "arguments");
    if (!a)
        a = json_object_get(o, "parameters");
    if (json_is_string(a)) { /* arguments already as JSON text */
        json_t *parsed = json_loads(json_string_value(a), JSON_DECODE_ANY, NULL);
        if (!parsed)
            return false;
        bool ok = add_call(cs, json_string_value(nm), json_string_length(nm), parsed);
        json_decref(parsed);
        return ok;
    }
    return add_call(cs, json_string_value(nm), json_string_length(nm), a);
}

/* The {"name", "arguments"} object at s[p, len) as a call; *end: past it and the blanks
   after it. */
static bool object_call_at(const char *s, size_t len, size_t p, struct calls *cs, size_t *end)
{
    size_t k;
    json_t *o = json_at(s, len, p, &k);
    bool ok = o && call_object(cs, o);
    json_decref(o);
    if (ok)
        *end = skip_ws(s, len, p + k);
    return ok;
}

static bool parse_hermes(const char *s, size_t len, size_t p, struct calls *cs)
{
    while (p < len) {
        if (!starts(s, len, p, "<tool_call>"))
            return cs->n > 0; /* text after the calls: ignored */
        if (!object_call_at(s, len, skip_ws(s, len, p + 11), cs, &p))
            return false;
        if (starts(s, len, p, "</tool_call>"))
            p = skip_ws(s, len, p + 12);
        else if (p < len)
            return false;
    }
    return cs->n > 0;
}

static bool parse_llama3(const char *s, size_t len, size_t p, struct calls *cs)
{
    if (starts(s, len, p, "<|python_tag|>"))
        p = skip_ws(s, len, p + 14);
    for (;;) {
        if (!object_call_at(s, len, p, cs, &p))
            return false;
        if (p < len && s[p] == ';') {
            p = skip_ws(s, len, p + 1);
            if (p < len)
                continue;
        }
        return p == len;
    }
}

static bool parse_mistral(const char *s, size_t len, size_t p, struct calls *cs)
{
    while (p < len) {
        if (!starts(s, len, p, "[TOOL_CALLS]"))
            return cs->n > 0;
        p = skip_ws(s, len, p + 12);
        size_t k;
        if (p < len && s[p] == '[') { /* [{"name", "arguments"}, ...] */
            json_t *a = json_at(s, len, p, &k);
            if (!json_is_array(a) || !json_array_size(a)) {
                json_decref(a);
                return false;
            }
            size_t i;
            json_t *o;
            bool ok = true;
            json_array_foreach(a, i, o) ok = ok && call_object(cs, o);
            json_decref(a);
            if (!ok)
                return false;
        } else { /* NAME[ARGS]{...} */
            size_t q = find(s, len, p, "[ARGS]");
            if (q == (size_t)-1 || q == p)
                return false;
            json_t *o = json_at(s, len, q + 6, &k);
            if (!o)
                return false;
            bool ok = add_call(cs, s + p, q - p, o);
            json_decref(o);
            if (!ok)
                return false;
            p = q + 6;
        }
        p = skip_ws(s, len, p + k);
    }
    return cs->n > 0;
}

static bool parse_deepseek(const char *s, size_t len, size_t p, struct calls *cs)
{
    if (starts(s, len, p, DS_CALLS_BEGIN))
        p = skip_ws(s, len, p + strlen(DS_CALLS_BEGIN));
    while (starts(s, len, p, DS_CALL_BEGIN)) {
        p += strlen(DS_CALL_BEGIN);
        size_t sep = find(s, len, p, DS_SEP);
        if (sep == (size_t)-1)
            return false;
        const char *name;
        size_t nl, q = sep + strlen(DS_SEP);
        if (sep - p == 8 && !memcmp(s + p, "function", 8)) { /* V3: NAME\n```json\n{..}\n``` */
            size_t eol = find(s, len, q, "\n");
            if (eol == (size_t)-1)
                return false;
            name = s + q, nl = eol - q;
            q = skip_ws(s, len, eol);
            if (starts(s, len, q, "```json"))
                q = skip_ws(s, len, q + 7);
        } else { /* V3.1: NAME<sep>{..} */
            name = s + p, nl = sep - p;
        }
        size_t k;
        json_t *o = json_at(s, len, q, &k);
        if (!o || !nl)
            return json_decref(o), false;
        bool ok = add_call(cs, name, nl, o);
        json_decref(o);
        if (!ok)
            return false;
        q = skip_ws(s, len, q + k);
        if (starts(s, len, q, "```"))
            q = skip_ws(s, len, q + 3);
        if (!starts(s, len, q, DS_CALL_END))
            return false;
        p = skip_ws(s, len, q + strlen(DS_CALL_END));
    }
    return cs->n > 0;
}

/* Where the calls of text begin for parser p ((size_t)-1: nowhere). */
static size_t marker_at(enum tool_parser p, const char *s, size_t len)
{
    switch (p) {
    case TOOL_PARSER_HERMES: return find(s, len, 0, "<tool_call>");
    case TOOL_PARSER_MISTRAL: return find(s, len, 0, "[TOOL_CALLS]");
    case TOOL_PARSER_DEEPSEEK_V3: {
        size_t a = find(s, len, 0, DS_CALLS_BEGIN), b = find(s, len, 0, DS_CALL_BEGIN);
        return a < b ? a : b;
    }
    case TOOL_PARSER_LLAMA3_JSON: {
        size_t q = skip_ws(s, len, 0);
        return q < len && (s[q] == '{' || starts(s, len, q, "<|python_tag|>")) ? q : (size_t)-1;
    }
    default: return (size_t)-1;
    }
}

int server_tools_extract(const struct server_tools *t, const char *text, size_t len,
                         size_t *content_len, struct tool_call **calls, int *n_calls)
{
    struct calls cs = {0};
    *calls = NULL, *n_calls = 0, *content_len = len;
    bool ok = false;
    size_t start = 0;
    if (t->choice == TOOL_CHOICE_NAMED) {
        size_t k;
        json_t *o = json_at(text, len, skip_ws(text, len, 0), &k);
        ok = o && add_call(&cs, t->named, strlen(t->named), o);
        json_decref(o);
    } else if (t->choice == TOOL_CHOICE_REQUIRED) {
        size_t k, i;
        json_t *a = json_at(text, len, skip_ws(text, len, 0), &k), *o;
        ok = json_is_array(a) && json_array_size(a);
        json_array_foreach(a, i, o) ok = ok && call_object(&cs, o);
        json_decref(a);
    } else if (t->choice == TOOL_CHOICE_AUTO &&
               (start = marker_at(t->parser, text, len)) != (size_t)-1) {
        switch (t->parser) {
        case TOOL_PARSER_HERMES: ok = parse_hermes(text, len, start, &cs); break;
        case TOOL_PARSER_LLAMA3_JSON:
            ok = parse_llama3(text, len, start, &cs);
            start = 0; /* leading blanks are not content */
            break;
        case TOOL_PARSER_MISTRAL: ok = parse_mistral(text, len, start, &cs); break;
        case TOOL_PARSER_DEEPSEEK_V3: ok = parse_deepseek(text, len, start, &cs); break;
        default: break;
        }
        if (ok && !t->parallel && cs.n > 1) { /* the first call only */
            free_fields(cs.c + 1, cs.n - 1);
            cs.n = 1;
        }
    }
    if (!ok || cs.bad || !cs.n) {
        tool_calls_free(cs.c, cs.n);
        return cs.bad ? WELD_ERR_NOMEM : WELD_OK;
    }
    *calls = cs.c, *n_calls = cs.n;
    *content_len = t->choice == TOOL_CHOICE_AUTO ? start : 0;
    return WELD_OK;
}

size_t server_tools_content_prefix(const struct server_tools *t, const char *text, size_t len)
{
    if (t->choice == TOOL_CHOICE_REQUIRED || t->choice == TOOL_CHOICE_NAMED)
        return 0;
    if (t->choice != TOOL_CHOICE_AUTO)
        return len;
    if (t->parser == TOOL_PARSER_LLAMA3_JSON) {
        size_t q = skip_ws(text, len, 0);
        if (q == len)
            return 0; /* blanks only: the calls may still come */
        if (text[q] == '{')
            return 0;
        const char *tag = "<|python_tag|>";
        size_t m = len - q < 14 ? len - q : 14;
        return memcmp(text + q, tag, m) ? len : 0;
    }
    size_t at = marker_at(t->parser, text, len);
    if (at != (size_t)-1)
        return at;
    const char *mk[2] = {t->parser == TOOL_PARSER_HERMES    ? "<tool_call>"
                         : t->parser == TOOL_PARSER_MISTRAL ? "[TOOL_CALLS]"
                                                            : DS_CALLS_BEGIN,
                         t->parser == TOOL_PARSER_DEEPSEEK_V3 ? DS_CALL_BEGIN : NULL};
    size_t hold = 0;
    for (int i = 0; i < 2 && mk[i]; i++) {
        size_t ml = strlen(mk[i]);
        for (size_t k = ml - 1; k > hold; k--)
            if (k <= len && !memcmp(text + len - k, mk[i], k)) {
                hold = k;
                break;
            }
    }
    return len - hold;
}

void tool_calls_free(struct tool_call *c, int n)
{
    free_fields(c, n);
    wfree(c);
}

json_t *tool_calls_json(const struct tool_call *c, int n, const char *id, int choice)
{
    json_t *a = json_array();
    const char *tail = strrchr(id, '-'); /* "chatcmpl-<hex>": the hex */
    tail = tail ? tail + 1 : id;
    for (int i = 0; i < n; i++) {
        char cid[128];
        snprintf(cid, sizeof cid, "call_%s%d%d", tail, choice, i);
        json_array_append_new(a, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", cid, "type",
                                           "function", "function", "name", c[i].name, "arguments",
                                           c[i].arguments));
    }
    return a;
}
