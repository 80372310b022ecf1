/*
 * structured - see structured.h.
 */
#include "engine/structured.h"

#include "core/alloc.h"
#include "core/strbuf.h"
#include "grammar/regex.h"
#include "grammar/schema.h"

#include <string.h>

const char *const structured_fields[] = {"response_format",
                                         "structured_outputs",
                                         "guided_json",
                                         "guided_regex",
                                         "guided_choice",
                                         "guided_grammar",
                                         "guided_decoding_backend",
                                         "guided_whitespace_pattern",
                                         "grammar",
                                         "json_schema",
                                         NULL};

static bool set(const json_t *v)
{
    return v && !json_is_null(v);
}

/* A schema given as a JSON value (object, or text holding one) -> GBNF. */
static int from_schema(const json_t *v, const char *field, const struct schema_opts *opts,
                       char **gbnf, struct weld_err *e)
{
    int rc;
    if (json_is_string(v)) {
        rc = grammar_gbnf_json_schema_ex(json_string_value(v), json_string_length(v), "root", opts,
                                         gbnf, e);
    } else if (json_is_object(v) || json_is_boolean(v)) {
        char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!t)
            return err_set(e, WELD_ERR_NOMEM, "field '%s': out of memory", field);
        rc = grammar_gbnf_json_schema_ex(t, strlen(t), "root", opts, gbnf, e);
        free(t);
    } else {
        return err_set(e, WELD_ERR_INVALID_ARG, "field '%s': expected a JSON Schema (an object)",
                       field);
    }
    return rc ? err_prefix(e, "field '%s'", field) : WELD_OK;
}

static int from_regex(const json_t *v, const char *field, char **gbnf, struct weld_err *e)
{
    if (!json_is_string(v))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "field '%s': expected a string (a regular "
                       "expression)",
                       field);
    int rc = grammar_gbnf_from_regex(json_string_value(v), json_string_length(v), false, false,
                                     "root", gbnf, e);
    return rc ? err_prefix(e, "field '%s'", field) : WELD_OK;
}

static int from_choice(const json_t *v, const char *field, char **gbnf, struct weld_err *e)
{
    if (!json_is_array(v) || !json_array_size(v))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "field '%s': expected a non-empty array of "
                       "strings",
                       field);
    struct strbuf o = {0};
    strbuf_printf(&o, "root ::= ");
    size_t i;
    const json_t *x;
    json_array_foreach(v, i, x)
    {
        if (!json_is_string(x) || !json_string_length(x)) {
            wfree(o.p);
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "field '%s[%zu]': expected a non-empty "
                           "string",
                           field, i);
        }
        if (i)
            strbuf_printf(&o, " | ");
        grammar_gbnf_literal(&o, json_string_value(x), json_string_length(x));
    }
    strbuf_printf(&o, "\n");
    if (o.oom) {
        wfree(o.p);
        return err_set(e, WELD_ERR_NOMEM, "field '%s': out of memory", field);
    }
    *gbnf = o.p;
    return WELD_OK;
}

static int from_grammar(const json_t *v, const char *field, char **gbnf, struct weld_err *e)
{
    if (!json_is_string(v) || !json_string_length(v))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "field '%s': expected a GBNF grammar (a "
                       "non-empty string)",
                       field);
    if (!(*gbnf = wstrdup(json_string_value(v))))
        return err_set(e, WELD_ERR_NOMEM, "field '%s': out of memory", field);
    return WELD_OK;
}

static int any_object(const struct schema_opts *opts, char **gbnf, struct weld_err *e)
{
    static const char obj[] = "{\"type\": \"object\"}";
    return grammar_gbnf_json_schema_ex(obj, sizeof obj - 1, "root", opts, gbnf, e);
}

static int response_format(const json_t *rf, const struct schema_opts *opts, char **gbnf,
                           struct weld_err *e)
{
    if (!json_is_object(rf))
        return err_set(e, WELD_ERR_INVALID_ARG, "field 'response_format': expected an object");
    const json_t *t = json_object_get(rf, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "";
    if (!strcmp(type, "text"))
        return WELD_OK;
    if (!strcmp(type, "json_object"))
        return any_object(opts, gbnf, e);
    if (strcmp(type, "json_schema"))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "field 'response_format.type': expected "
                       "\"text\", \"json_object\" or \"json_schema\"");
    const json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "field 'response_format.json_schema': expected "
                       "an object {\"name\", \"schema\", \"strict\"}");
    const json_t *s = json_object_get(js, "schema");
    if (!set(s))
        return any_object(opts, gbnf, e);
    return from_schema(s, "response_format.json_schema.schema", opts, gbnf, e);
}

static int structured_outputs(const json_t *so, const struct schema_opts *opts, char **gbnf,
                              struct weld_err *e)
{
    if (!json_is_object(so))
        return err_set(e, WELD_ERR_INVALID_ARG, "field 'structured_outputs': expected an object");
    const char *key;
    const json_t *v;
    const char *which = NULL;
    json_object_foreach((json_t *)so, key, v)
    {
        if (!set(v) || json_is_false(v) || !strcmp(key, "backend") ||
            !strcmp(key, "disable_any_whitespace") || !strcmp(key, "disable_fallback") ||
            !strcmp(key, "disable_additional_properties"))
            continue;
        if (strcmp(key, "json") && strcmp(key, "regex") && strcmp(key, "choice") &&
            strcmp(key, "grammar") && strcmp(key, "json_object"))
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "field 'structured_outputs.%s': not "
                           "supported (json, regex, choice, grammar and json_object are)",
                           key);
        if (which)
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "field 'structured_outputs': both '%s' and "
                           "'%s' are set; give one constraint",
                           which, key);
        which = key;
    }
    if (!which)
        return WELD_OK;
    v = json_object_get(so, which);
    char field[64];
    snprintf(field, sizeof field, "structured_outputs.%s", which);
    if (!strcmp(which, "json"))
        return from_schema(v, field, opts, gbnf, e);
    if (!strcmp(which, "regex"))
        return from_regex(v, field, gbnf, e);
    if (!strcmp(which, "choice"))
        return from_choice(v, field, gbnf, e);
    if (!strcmp(which, "grammar"))
        return from_grammar(v, field, gbnf, e);
    return any_object(opts, gbnf, e);
}

int structured_gbnf(const json_t *o, const struct schema_opts *opts, char **gbnf,
                    struct weld_err *e)
{
    *gbnf = NULL;
    const char *which = NULL;
    for (int i = 0; structured_fields[i]; i++) {
        const char *f = structured_fields[i];
        const json_t *v = json_object_get(o, f);
        if (!set(v) || !strcmp(f, "guided_decoding_backend"))
            continue;
        if (!strcmp(f, "response_format") && json_is_object(v) &&
            json_is_string(json_object_get(v, "type")) &&
            !strcmp(json_string_value(json_object_get(v, "type")), "text"))
            continue;
        if (!strcmp(f, "guided_whitespace_pattern"))
            return err_set(e, WELD_ERR_UNSUPPORTED,
                           "field 'guided_whitespace_pattern': not "
                           "supported (JSON output has at most a few blanks between tokens)");
        if (which)
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "fields '%s' and '%s' both constrain the "
                           "output; give one",
                           which, f);
        which = f;
    }
    if (!which)
        return WELD_OK;
    const json_t *v = json_object_get(o, which);
    if (!strcmp(which, "response_format"))
        return response_format(v, opts, gbnf, e);
    if (!strcmp(which, "structured_outputs"))
        return structured_outputs(v, opts, gbnf, e);
    if (!strcmp(which, "guided_json") || !strcmp(which, "json_schema"))
        return from_schema(v, which, opts, gbnf, e);
    if (!strcmp(which, "guided_regex"))
        return from_regex(v, which, gbnf, e);
    if (!strcmp(which, "guided_choice"))
        return from_choice(v, which, gbnf, e);
    return from_grammar(v, which, gbnf, e);
}
