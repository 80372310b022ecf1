/*
 * args - the option parser declared in cli.h.
 */
#include "cli/cli.h"
#include "core/log.h"
#include "grammar/schema.h"

#include <jansson.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0 || !isfinite(v))
        return -1;
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; break;
        case 'm': case 'M': mul = 1024.0 * 1024; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
        case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
        case 'b': case 'B': break;
        default: return -1;
        }
        end++;
        if (*end == 'i' || *end == 'I')
            end++;
        if (*end == 'b' || *end == 'B')
            end++;
        if (*end)
            return -1;
    }
    v *= mul;
    if (v > 1.8e19)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

/* llama.cpp's several-letter single-dash names, for the long options that have one. */
static const struct {
    const char *alias, *name;
} aliases[] = {
    {"md", "model-draft"},
    {"jf", "json-schema-file"},
    {"tp", "tensor-parallel-size"},
    {"pp", "pipeline-parallel-size"},
};

static const char *alias_of(const char *name)
{
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(aliases[i].name, name))
            return aliases[i].alias;
    return NULL;
}

static void print_help(const char *usage, const char *description, const struct cli_opt *opts,
                       int n_opts)
{
    printf("usage: weld %s\n\n%s\n", usage, description);
    if (n_opts)
        printf("\noptions:\n");
    for (int i = 0; i < n_opts; i++) {
        char left[64];
        const struct cli_opt *o = &opts[i];
        const char *al = alias_of(o->name);
        if (o->short_name || al) {
            char sh[16];
            if (al)
                snprintf(sh, sizeof sh, "%s", al);
            else
                snprintf(sh, sizeof sh, "%c", o->short_name);
            snprintf(left, sizeof left, "-%s, --%s%s%s", sh, o->name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
        } else
            snprintf(left, sizeof left, "    --%s%s%s", o->name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
        printf("  %-28s %s\n", left, o->help);
    }
    printf("  %-28s %s\n", "-h, --help", "show this help");
}

static int set_value(const struct cli_opt *o, const char *v)
{
    char *end;
    errno = 0;
    switch (o->type) {
    case OPT_FLAG:
        *(bool *)o->dst = true;
        return 0;
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (end == v || *end || errno || x < -2147483647L || x > 2147483647L)
            return -1;
        *(int *)o->dst = (int)x;
        return 0;
    }
    case OPT_I64: {
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || errno)
            return -1;
        *(int64_t *)o->dst = x;
        return 0;
    }
    case OPT_U64: {
        if (*v == '-')
            return -1;
        unsigned long long x = strtoull(v, &end, 10);
        if (end == v || *end || errno)
            return -1;
        *(uint64_t *)o->dst = x;
        return 0;
    }
    case OPT_FLOAT: {
        float x = strtof(v, &end);
        if (end == v || *end || errno || !isfinite(x))
            return -1;
        *(float *)o->dst = x;
        return 0;
    }
    case OPT_STR:
        *(const char **)o->dst = v;
        return 0;
    case OPT_SIZE:
        return cli_parse_size(v, (uint64_t *)o->dst);
    case OPT_STRS: {
        struct cli_strs *l = o->dst;
        if (l->n >= CLI_STRS_MAX)
            return -1;
        l->v[l->n++] = v;
        return 0;
    }
    }
    return -1;
}

int cli_parse(int argc, char **argv, const char *usage, const char *description,
              const struct cli_opt *opts, int n_opts, const char **pos, int max_pos,
              int *n_pos)
{
    *n_pos = 0;
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == '\0') {
            if (*n_pos >= max_pos) {
                fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", log_prefix(), a);
                return 2;
            }
            pos[(*n_pos)++] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            only_pos = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_help(usage, description, opts, n_opts);
            return 1;
        }
        const struct cli_opt *o = NULL;
        const char *inline_val = NULL;
        if (a[1] == '-') {
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            for (int j = 0; j < n_opts; j++)
                if (strlen(opts[j].name) == len && !strncmp(opts[j].name, name, len))
                    o = &opts[j];
            if (eq)
                inline_val = eq + 1;
        } else if (a[2] == '\0') {
            for (int j = 0; j < n_opts; j++)
                if (opts[j].short_name == a[1])
                    o = &opts[j];
        } else {
            for (int j = 0; j < n_opts; j++)
                if (alias_of(opts[j].name) && !strcmp(alias_of(opts[j].name), a + 1))
                    o = &opts[j];
        }
        if (!o) {
            fprintf(stderr, "%s: unknown option '%s' (see --help)\n", log_prefix(), a);
            return 2;
        }
        const char *val = inline_val;
        if (o->type != OPT_FLAG && !val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: option '%s' needs a value %s\n", log_prefix(), a,
                        o->metavar ? o->metavar : "");
                return 2;
            }
            val = argv[++i];
        }
        if (o->type == OPT_FLAG && inline_val) {
            fprintf(stderr, "%s: option '--%s' takes no value\n", log_prefix(), o->name);
            return 2;
        }
        if (set_value(o, val) != 0) {
            char typed[80]; /* the option as the user spelled it */
            if (a[1] == '-')
                snprintf(typed, sizeof typed, "--%s", o->name);
            else if (a[2] == '\0')
                snprintf(typed, sizeof typed, "-%c (--%s)", o->short_name, o->name);
            else
                snprintf(typed, sizeof typed, "%s (--%s)", a, o->name);
            if (o->type == OPT_STRS) /* the value may be a secret: not echoed */
                fprintf(stderr, "%s: %s given more than %d times\n", log_prefix(), typed,
                        CLI_STRS_MAX);
            else
                fprintf(stderr, "%s: bad value '%s' for %s\n", log_prefix(), val, typed);
            return 2;
        }
    }
    return 0;
}

int cli_structured_outputs_config(const char *json, struct schema_opts *o, struct weld_err *e)
{
    memset(o, 0, sizeof *o);
    json_error_t je;
    json_t *j = json_loads(json, 0, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--structured-outputs-config: expected a JSON "
                       "object, e.g. '{\"disable_any_whitespace\": true}'");
    }
    const char *k;
    json_t *v;
    int rc = WELD_OK;
    json_object_foreach(j, k, v)
    {
        bool is_bool = json_is_boolean(v);
        if (!strcmp(k, "backend")) {
            /* one backend here, whatever the name ("auto", "xgrammar", "guidance", ...) */
            if (!json_is_string(v))
                rc = err_set(e, WELD_ERR_INVALID_ARG,
                             "--structured-outputs-config: "
                             "'backend' must be a string");
        } else if (!strcmp(k, "disable_any_whitespace") && is_bool) {
            o->no_whitespace = json_is_true(v);
        } else if (!strcmp(k, "disable_additional_properties") && is_bool) {
            o->no_additional_properties = json_is_true(v);
        } else if (!strcmp(k, "disable_fallback") && is_bool) {
            /* nothing to fall back to */
        } else if (!strcmp(k, "disable_any_whitespace") ||
                   !strcmp(k, "disable_additional_properties") || !strcmp(k, "disable_fallback")) {
            rc = err_set(e, WELD_ERR_INVALID_ARG,
                         "--structured-outputs-config: '%s' must be "
                         "true or false",
                         k);
        } else {
            rc = err_set(e, WELD_ERR_INVALID_ARG,
                         "--structured-outputs-config: '%s' is not "
                         "an option (backend, disable_any_whitespace, "
                         "disable_additional_properties, disable_fallback)",
                         k);
        }
        if (rc)
            break;
    }
    json_decref(j);
    return rc;
}
