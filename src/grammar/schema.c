/*
 * schema - JSON Schema to GBNF (grammar/schema.h): what `response_format: json_schema`
 * and `guided_json` compile through.
 *
 * Each schema node becomes a rule named after its path (`root`, `root-name`, `root-1`,
 * ...), written into one growing text; shared primitives (`string`, `number`, `integer`,
 * `value`, `ws`, ...) are emitted once, when first used. Objects list their properties in
 * schema order: required ones always present, optional ones each optional, then, unless
 * additionalProperties is false, any other "key": value pairs. White space between tokens is
 * at most WS_MAX characters, so a model cannot spend its budget on blanks. $ref resolves
 * "#", "#/$defs/X" and "#/definitions/X" (a rule per target, so recursive schemas are
 * recursive rules).
 *
 * Supported: type (one or a list), properties, required, additionalProperties (false,
 * true, a schema), enum, const, items, prefixItems, minItems, maxItems, anyOf, oneOf (as
 * anyOf: exclusivity is not enforced), $ref/$defs/definitions, minLength, maxLength, format
 * (date with each month's days, time, date-time, uuid; email, hostname, ipv4 and uri as
 * regular expressions for a common subset), pattern (a search, grammar/regex.c, written as
 * JSON escapes it), minimum / maximum / exclusiveMinimum / exclusiveMaximum on integers
 * (digit-range alternatives, exact) and whole minimum / maximum on numbers (no exponent
 * then), and the annotations (title, description, default, examples, $schema, $id,
 * $comment, strict, nullable: false, readOnly, writeOnly, deprecated). A schema without
 * "type" takes the type its keywords imply (minLength: string, minimum: number, ...).
 * Anything else is refused, naming the keyword and where it is, never ignored: fractional
 * or exclusive bounds on numbers, multipleOf, allOf, not, if/then/else, patternProperties,
 * propertyNames, uniqueItems, contains, min/maxProperties, other formats.
 * Numbers have at most 16 integer and 16 fraction digits, exponents 2.
 * Not yet: the key of an additional property may repeat a declared property's name, whose
 * value a validator then checks against that property's schema.
 */
#include "grammar/schema.h"

#include "core/alloc.h"
#include "core/json.h"
#include "core/strbuf.h"
#include "grammar/grammar.h"
#include "grammar/regex.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define WS_MAX 4
#define MAX_DEPTH 64

void grammar_gbnf_literal(struct strbuf *o, const char *s, size_t n)
{
    strbuf_put(o, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            strbuf_printf(o, "\\%c", c);
        else if (c < 0x20 || c == 0x7F)
            strbuf_printf(o, "\\x%02x", c);
        else
            strbuf_put(o, (const char *)&c, 1);
    }
    strbuf_put(o, "\"", 1);
}

enum prim {
    P_WS,
    P_CHAR,
    P_STRING,
    P_NUMBER,
    P_INTEGER,
    P_BOOLEAN,
    P_NULL,
    P_VALUE,
    P_OBJECT,
    P_ARRAY,
    P_DATE,
    P_TIME,
    P_DATETIME,
    P_UUID,
    P_N
};

static const char *const prim_name[P_N] = {"ws",      "char", "string",    "number", "integer",
                                           "boolean", "null", "value",     "object", "array",
                                           "date",    "time", "date-time", "uuid"};

static const char *const prim_rule[P_N] = {
    "[ \\t\\n]{0,4}",
    /* escapes of scalar values: a surrogate only as a high-low pair */
    "[^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-CeEfF] [0-9a-fA-F]{3} | "
    "[dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} \"\\\\u\" [dD] [c-fC-F] [0-9a-fA-F]{2} ) )",
    "\"\\\"\" char* \"\\\"\"",
    "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?",
    "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} )",
    "\"true\" | \"false\"",
    "\"null\"",
    "object | array | string | number | boolean | null",
    "\"{\" ws ( string ws \":\" ws value ( ws \",\" ws string ws \":\" ws value )* )? ws \"}\"",
    "\"[\" ws ( value ( ws \",\" ws value )* )? ws \"]\"",
    /* each month's days; February's 29th in leap years only (by 4, centuries by 400) */
    "[0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | "
    "( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | "
    "\"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) ) | "
    "( [0-9] [0-9] ( \"0\" [48] | [2468] [048] | [13579] [26] ) | "
    "( \"0\" [048] | [2468] [048] | [13579] [26] ) \"00\" ) \"-02-29\"",
    "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? "
    "( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )",
    "date \"T\" time",
    "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
    "[0-9a-fA-F]{12}",
};

/* what each primitive uses */
static const uint16_t prim_deps[P_N] = {
    [P_STRING] = 1 << P_CHAR,
    [P_VALUE] = 1 << P_OBJECT | 1 << P_ARRAY | 1 << P_STRING | 1 << P_NUMBER | 1 << P_BOOLEAN |
                1 << P_NULL,
    [P_OBJECT] = 1 << P_WS | 1 << P_STRING | 1 << P_VALUE,
    [P_ARRAY] = 1 << P_WS | 1 << P_VALUE,
    [P_DATETIME] = 1 << P_DATE | 1 << P_TIME,
};

struct conv {
    struct strbuf o;
    struct schema_opts opt;
    json_t *root;
    uint16_t used; /* primitives to emit */
    int n_rules;
    struct {
        const json_t *node;
        int id;
    } refs[256]; /* $ref targets already given a rule */
    int n_refs;
    struct weld_err *e;
    int rc;
};

static int refuse(struct conv *c, const char *path, const char *fmt, ...)
{
    if (c->rc)
        return c->rc;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->rc = err_set(c->e, WELD_ERR_INVALID_ARG, "json_schema: at %s: %s", path[0] ? path : "/",
                    msg);
    return c->rc;
}

static void use(struct conv *c, enum prim p)
{
    if (c->used >> p & 1)
        return;
    c->used |= (uint16_t)(1u << p);
    for (int q = 0; q < P_N; q++)
        if (prim_deps[p] >> q & 1)
            use(c, (enum prim)q);
}

static int schema_rule(struct conv *c, const json_t *s, const char *path, int depth);

/* The rule id for $ref target t (made and emitted on first use). */
static int ref_rule(struct conv *c, const char *ref, const char *path, int depth)
{
    const json_t *t = NULL;
    if (!strcmp(ref, "#"))
        t = c->root;
    else if (!strncmp(ref, "#/$defs/", 8))
        t = json_object_get(json_object_get(c->root, "$defs"), ref + 8);
    else if (!strncmp(ref, "#/definitions/", 14))
        t = json_object_get(json_object_get(c->root, "definitions"), ref + 14);
    else
        return refuse(c, path,
                      "$ref \"%s\": only \"#\", \"#/$defs/NAME\" and "
                      "\"#/definitions/NAME\" are supported",
                      ref),
               -1;
    if (!t)
        return refuse(c, path, "$ref \"%s\" names nothing", ref), -1;
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].node == t)
            return c->refs[i].id;
    if (c->n_refs == 256)
        return refuse(c, path, "more than 256 $ref targets"), -1;
    /* reserve the id first: a recursive schema refers to itself */
    int id = c->n_rules++;
    c->refs[c->n_refs].node = t, c->refs[c->n_refs++].id = id;
    struct strbuf saved = c->o;
    c->o = (struct strbuf){0};
    int body = schema_rule(c, t, ref, depth + 1);
    struct strbuf mine = c->o;
    c->o = saved;
    if (body >= 0)
        strbuf_printf(&c->o, "r%d ::= r%d\n", id, body);
    strbuf_put(&c->o, mine.p ? mine.p : "", mine.n);
    c->o.oom |= mine.oom;
    wfree(mine.p);
    return body < 0 ? -1 : id;
}

static const char *const known_keys[] = {
    "type",        "properties", "required",    "additionalProperties",
    "enum",        "const",      "items",       "prefixItems",
    "minItems",    "maxItems",   "anyOf",       "oneOf",
    "$ref",        "$defs",      "definitions", "minLength",
    "maxLength",   "format",     "pattern",     "title",
    "description", "default",    "examples",    "$schema",
    "$id",         "$comment",   "strict",      "nullable",
    "readOnly",    "writeOnly",  "deprecated", "minimum",    "maximum",
    "exclusiveMinimum", "exclusiveMaximum"};

static int check_keys(struct conv *c, const json_t *s, const char *path)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v)
    {
        bool ok = false;
        for (size_t i = 0; i < sizeof known_keys / sizeof *known_keys; i++)
            ok |= !strcmp(k, known_keys[i]);
        if (!strcmp(k, "nullable") && json_is_true(v))
            ok = false;
        if (!ok)
            return refuse(c, path, "\"%s\" is not supported", k);
    }
    return 0;
}

static int get_count(struct conv *c, const json_t *s, const char *key, int dflt, const char *path,
                     int *out)
{
    const json_t *v = json_object_get(s, key);
    *out = dflt;
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return refuse(c, path, "\"%s\" must be a non-negative integer", key);
    if (json_integer_value(v) > 1000)
        return refuse(c, path, "\"%s\" above 1000 is not supported", key);
    *out = (int)json_integer_value(v);
    return 0;
}

/* "x{m,n}" (n < 0: unbounded) after the element text x. */
static void put_count(struct conv *c, int m, int n)
{
    if (n < 0)
        strbuf_printf(&c->o, m ? "{%d,}" : "*", m);
    else
        strbuf_printf(&c->o, "{%d,%d}", m, n);
}

static int type_rule(struct conv *c, const json_t *s, const char *type, const char *path,
                     int depth);

/* A new rule: any of rules kids[0, n). */
static int alts_rule(struct conv *c, const int *kids, size_t n)
{
    int id = c->n_rules++;
    strbuf_printf(&c->o, "r%d ::=", id);
    for (size_t i = 0; i < n; i++)
        strbuf_printf(&c->o, "%s r%d", i ? " |" : "", kids[i]);
    strbuf_put(&c->o, "\n", 1);
    return id;
}

/* A new rule for schema s; returns its id (-1: refused, c->rc set). */
static int schema_rule(struct conv *c, const json_t *s, const char *path, int depth)
{
    if (depth > MAX_DEPTH)
        return refuse(c, path, "nested more than %d levels", MAX_DEPTH), -1;
    if (json_is_true(s) || (json_is_object(s) && !json_object_size(s))) {
        use(c, P_VALUE);
        int id = c->n_rules++;
        strbuf_printf(&c->o, "r%d ::= value\n", id);
        return id;
    }
    if (!json_is_object(s))
        return refuse(c, path, "a schema must be an object or true"), -1;
    if (check_keys(c, s, path))
        return -1;
    const json_t *v;
    char sub[1024];
    if ((v = json_object_get(s, "$ref"))) {
        if (!json_is_string(v))
            return refuse(c, path, "$ref must be a string"), -1;
        return ref_rule(c, json_string_value(v), path, depth);
    }
    if ((v = json_object_get(s, "const")) || (v = json_object_get(s, "enum"))) {
        bool is_enum = !json_object_get(s, "const");
        if (is_enum && (!json_is_array(v) || !json_array_size(v)))
            return refuse(c, path, "\"enum\" must be a non-empty array"), -1;
        int id = c->n_rules++;
        strbuf_printf(&c->o, "r%d ::= ", id);
        size_t n = is_enum ? json_array_size(v) : 1;
        for (size_t i = 0; i < n; i++) {
            char *js = json_dumps(is_enum ? json_array_get(v, i) : v,
                                  JSON_ENCODE_ANY | JSON_COMPACT);
            if (!js)
                return c->o.oom = true, -1;
            strbuf_put(&c->o, i ? " | " : "", i ? 3 : 0);
            grammar_gbnf_literal(&c->o, js, strlen(js));
            free(js);
        }
        strbuf_put(&c->o, "\n", 1);
        return id;
    }
    const json_t *any = json_object_get(s, "anyOf");
    if (!any)
        any = json_object_get(s, "oneOf");
    if (any) {
        if (!json_is_array(any) || !json_array_size(any))
            return refuse(c, path, "\"anyOf\" / \"oneOf\" must be a non-empty array"), -1;
        int kids[64];
        size_t n = json_array_size(any);
        if (n > 64)
            return refuse(c, path, "more than 64 alternatives"), -1;
        for (size_t i = 0; i < n; i++) {
            snprintf(sub, sizeof sub, "%s/anyOf/%zu", path, i);
            if ((kids[i] = schema_rule(c, json_array_get(any, i), sub, depth + 1)) < 0)
                return -1;
        }
        return alts_rule(c, kids, n);
    }
    v = json_object_get(s, "type");
    if (!v) { /* no type: what its other keywords imply (a subset of what the schema allows:
                 {"minimum": 0} becomes numbers from 0), else any value */
        static const char *const implies[][2] = {
            {"properties", "object"},      {"additionalProperties", "object"},
            {"items", "array"},            {"prefixItems", "array"},
            {"minItems", "array"},         {"maxItems", "array"},
            {"minLength", "string"},       {"maxLength", "string"},
            {"pattern", "string"},         {"format", "string"},
            {"minimum", "number"},         {"maximum", "number"},
            {"exclusiveMinimum", "number"}, {"exclusiveMaximum", "number"}};
        const char *t = NULL;
        for (size_t i = 0; !t && i < sizeof implies / sizeof *implies; i++)
            if (json_object_get(s, implies[i][0]))
                t = implies[i][1];
        if (!t) {
            use(c, P_VALUE);
            int id = c->n_rules++;
            strbuf_printf(&c->o, "r%d ::= value\n", id);
            return id;
        }
        return type_rule(c, s, t, path, depth);
    }
    if (json_is_string(v))
        return type_rule(c, s, json_string_value(v), path, depth);
    if (!json_is_array(v) || !json_array_size(v) || json_array_size(v) > 8)
        return refuse(c, path, "\"type\" must be a type name or a list of them"), -1;
    int kids[8];
    size_t n = json_array_size(v);
    for (size_t i = 0; i < n; i++) {
        if (!json_is_string(json_array_get(v, i)))
            return refuse(c, path, "\"type\" must be a type name or a list of them"), -1;
        if ((kids[i] = type_rule(c, s, json_string_value(json_array_get(v, i)), path, depth)) < 0)
            return -1;
    }
    return alts_rule(c, kids, n);
}

static int object_rule(struct conv *c, const json_t *s, const char *path, int depth)
{
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return refuse(c, path, "\"properties\" must be an object"), -1;
    if (req && !json_is_array(req))
        return refuse(c, path, "\"required\" must be an array of names"), -1;
    for (size_t i = 0; req && i < json_array_size(req); i++)
        if (!json_is_string(json_array_get(req, i)) ||
            !json_object_get(props, json_string_value(json_array_get(req, i))))
            return refuse(c, path,
                          "\"required\" names \"%s\", which \"properties\" does not "
                          "define",
                          json_is_string(json_array_get(req, i))
                              ? json_string_value(json_array_get(req, i))
                              : "?"),
                   -1;
    const size_t np = props ? json_object_size(props) : 0;
    if (np > 256)
        return refuse(c, path, "more than 256 properties"), -1;
    int kid[256];
    bool need[256];
    const char *name[256];
    size_t i = 0;
    const char *k;
    json_t *pv;
    char sub[1024];
    if (props)
        json_object_foreach((json_t *)props, k, pv)
        {
            snprintf(sub, sizeof sub, "%s/properties/%s", path, k);
            name[i] = k;
            need[i] = false;
            for (size_t r = 0; req && r < json_array_size(req); r++)
                need[i] |= !strcmp(json_string_value(json_array_get(req, r)), k);
            if ((kid[i] = schema_rule(c, pv, sub, depth + 1)) < 0)
                return -1;
            i++;
        }
    int extra = -1; /* the rule of additional values, -1: none allowed */
    if ((!addl && !c->opt.no_additional_properties) || json_is_true(addl)) {
        use(c, P_VALUE);
        extra = -2; /* plain value */
    } else if (json_is_object(addl)) {
        snprintf(sub, sizeof sub, "%s/additionalProperties", path);
        if ((extra = schema_rule(c, addl, sub, depth + 1)) < 0)
            return -1;
    } else if (addl && !json_is_false(addl)) {
        return refuse(c, path, "\"additionalProperties\" must be a boolean or a schema"), -1;
    }
    use(c, P_WS);
    /* members in order: "first" then ", next"; a chain of rules, one per position, each
       knowing whether a member came before it */
    int id = c->n_rules++;
    int base = c->n_rules;
    c->n_rules += 2 * (int)np + 2;
    /* tail rules: t(i, after) = the members from i on; after: a member came before */
    for (int at = (int)np; at >= 0; at--)
        for (int after = 0; after < 2; after++) {
            int me = base + 2 * at + after;
            strbuf_printf(&c->o, "r%d ::= ", me);
            if (at == (int)np) {
                if (extra == -1) {
                    strbuf_put(&c->o, "\"\"\n", 3);
                    continue;
                }
                use(c, P_STRING);
                char ev[16];
                snprintf(ev, sizeof ev, extra == -2 ? "value" : "r%d", extra);
                const char *sep = after ? "ws \",\" ws " : "";
                strbuf_printf(
                    &c->o, "( %sstring ws \":\" ws %s ( ws \",\" ws string ws \":\" ws %s )* )?\n",
                    sep, ev, ev);
                continue;
            }
            /* the key as its JSON text, then its value, then what follows */
            json_t *js = json_string(name[at]);
            char *q = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
            json_decref(js);
            if (!q)
                return c->o.oom = true, -1;
            strbuf_printf(&c->o, "( %s", after ? "ws \",\" ws " : "");
            grammar_gbnf_literal(&c->o, q, strlen(q));
            free(q);
            strbuf_printf(&c->o, " ws \":\" ws r%d r%d )", kid[at], base + 2 * (at + 1) + 1);
            if (!need[at]) /* or skipped */
                strbuf_printf(&c->o, " | r%d", base + 2 * (at + 1) + after);
            strbuf_put(&c->o, "\n", 1);
        }
    strbuf_printf(&c->o, "r%d ::= \"{\" ws r%d ws \"}\"\n", id, base);
    return id;
}

static int array_rule(struct conv *c, const json_t *s, const char *path, int depth)
{
    const json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    int lo, hi;
    if (get_count(c, s, "minItems", 0, path, &lo) || get_count(c, s, "maxItems", -1, path, &hi))
        return -1;
    if (hi >= 0 && hi < lo)
        return refuse(c, path, "\"maxItems\" is below \"minItems\""), -1;
    char sub[1024];
    int np = 0, pre[64];
    if (prefix) {
        if (!json_is_array(prefix) || json_array_size(prefix) > 64)
            return refuse(c, path, "\"prefixItems\" must be an array of at most 64 schemas"), -1;
        np = (int)json_array_size(prefix);
        for (int i = 0; i < np; i++) {
            snprintf(sub, sizeof sub, "%s/prefixItems/%d", path, i);
            if ((pre[i] = schema_rule(c, json_array_get(prefix, (size_t)i), sub, depth + 1)) < 0)
                return -1;
        }
    }
    int item = -2; /* any value */
    if (items && json_is_false(items)) {
        item = -1; /* none past the prefix */
    } else if (items && !json_is_true(items)) {
        snprintf(sub, sizeof sub, "%s/items", path);
        if ((item = schema_rule(c, items, sub, depth + 1)) < 0)
            return -1;
    }
    if (item == -2)
        use(c, P_VALUE);
    use(c, P_WS);
    if (np && lo < np)
        lo = np; /* prefix items: all of them (a shorter array is refused for simplicity) */
    if (item == -1 && (hi < 0 || hi > np))
        hi = np;
    if (hi >= 0 && hi < np)
        return refuse(c, path, "\"maxItems\" below the number of \"prefixItems\""), -1;
    int id = c->n_rules++;
    char it[16];
    snprintf(it, sizeof it, item == -2 ? "value" : "r%d", item);
    strbuf_printf(&c->o, "r%d ::= \"[\" ws ", id);
    for (int i = 0; i < np; i++)
        strbuf_printf(&c->o, "%sr%d ", i ? "ws \",\" ws " : "", pre[i]);
    int more_lo = lo - np, more_hi = hi < 0 ? -1 : hi - np;
    if (item != -1 && (more_hi < 0 || more_hi > 0)) {
        if (np) { /* each further item after a comma */
            strbuf_printf(&c->o, "( ws \",\" ws %s )", it);
            put_count(c, more_lo, more_hi);
            strbuf_put(&c->o, " ", 1);
        } else if (more_lo > 0) {
            strbuf_printf(&c->o, "%s ( ws \",\" ws %s )", it, it);
            put_count(c, more_lo - 1, more_hi < 0 ? -1 : more_hi - 1);
            strbuf_put(&c->o, " ", 1);
        } else {
            strbuf_printf(&c->o, "( %s ( ws \",\" ws %s )", it, it);
            put_count(c, 0, more_hi < 0 ? -1 : more_hi - 1);
            strbuf_put(&c->o, " )? ", 4);
        }
    }
    strbuf_put(&c->o, "ws \"]\"\n", 7);
    return id;
}

/* Formats written as regular expressions: each a subset of what the format allows
   (and what ajv-formats accepts), from which a model can write any common value. */
static const char *const regex_formats[][2] = {
    {"email", "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)*@"
              "([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\\.){1,3}[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}"
              "[a-zA-Z0-9])?"},
    {"hostname", "[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}"
                 "[a-zA-Z0-9])?){0,2}"},
    {"ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}"
             "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"},
    {"uri", "https?://[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?){0,3}"
            "(:[1-9][0-9]{0,3})?(/[a-zA-Z0-9._~-]{0,30}){0,6}(\\?[a-zA-Z0-9._~=&-]{0,60})?"},
};

static int string_rule(struct conv *c, const json_t *s, const char *path)
{
    const json_t *f = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    if (pat) { /* a search for the pattern in the string's content */
        if (!json_is_string(pat))
            return refuse(c, path, "\"pattern\" must be a string"), -1;
        if (f || json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
            return refuse(c, path,
                          "\"pattern\" with \"format\" or a length bound is not "
                          "supported"),
                   -1;
        int id = c->n_rules++;
        char name[32], *g = NULL;
        snprintf(name, sizeof name, "r%dp", id);
        struct weld_err re;
        if (grammar_gbnf_from_regex(json_string_value(pat), json_string_length(pat), true, true,
                                    name, &g, &re) != WELD_OK)
            return refuse(c, path, "\"pattern\": %s", re.msg), -1;
        strbuf_printf(&c->o, "r%d ::= \"\\\"\" %s \"\\\"\"\n", id, name);
        strbuf_put(&c->o, g, strlen(g));
        wfree(g);
        return id;
    }
    int lo, hi;
    if (get_count(c, s, "minLength", 0, path, &lo) || get_count(c, s, "maxLength", -1, path, &hi))
        return -1;
    if (hi >= 0 && hi < lo)
        return refuse(c, path, "\"maxLength\" is below \"minLength\""), -1;
    int id = c->n_rules++;
    if (f) {
        static const struct {
            const char *name;
            enum prim p;
        } fmts[] = {{"date", P_DATE},
                    {"time", P_TIME},
                    {"date-time", P_DATETIME},
                    {"uuid", P_UUID}};
        const char *fs = json_is_string(f) ? json_string_value(f) : "";
        if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
            return refuse(c, path, "\"format\" with a length bound is not supported"), -1;
        for (size_t i = 0; i < sizeof fmts / sizeof *fmts; i++)
            if (!strcmp(fs, fmts[i].name)) {
                use(c, fmts[i].p);
                strbuf_printf(&c->o, "r%d ::= \"\\\"\" %s \"\\\"\"\n", id, prim_name[fmts[i].p]);
                return id;
            }
        for (size_t i = 0; i < sizeof regex_formats / sizeof *regex_formats; i++)
            if (!strcmp(fs, regex_formats[i][0])) {
                char name[32], *g = NULL;
                snprintf(name, sizeof name, "r%df", id);
                struct weld_err re;
                const char *rx = regex_formats[i][1];
                if (grammar_gbnf_from_regex(rx, strlen(rx), false, true, name, &g, &re) != WELD_OK)
                    return refuse(c, path, "format \"%s\": %s", fs, re.msg), -1;
                strbuf_printf(&c->o, "r%d ::= \"\\\"\" %s \"\\\"\"\n", id, name);
                strbuf_put(&c->o, g, strlen(g));
                wfree(g);
                return id;
            }
        return refuse(c, path,
                      "format \"%s\" is not supported (supported: date, time, date-time, "
                      "uuid, email, hostname, ipv4, uri)",
                      fs),
               -1;
    }
    use(c, P_CHAR);
    if (!json_object_get(s, "minLength") && !json_object_get(s, "maxLength")) {
        use(c, P_STRING);
        strbuf_printf(&c->o, "r%d ::= string\n", id);
        return id;
    }
    strbuf_printf(&c->o, "r%d ::= \"\\\"\" char", id);
    put_count(c, lo, hi);
    strbuf_put(&c->o, " \"\\\"\"\n", 6);
    return id;
}

/* ---- numbers with bounds ------------------------------------------------------------ */

#define NUM_LIM 9999999999999999LL /* 16 digits: the unbounded number rules' longest */

/* Alternatives for the equal-length digit strings in [lo, hi] (n digits each). */
static void put_same_len(struct strbuf *o, const char *lo, const char *hi, int n)
{
    if (n == 0)
        return;
    if (lo[0] == hi[0]) {
        strbuf_printf(o, "\"%c\"", lo[0]);
        if (n > 1) {
            strbuf_put(o, " ", 1);
            put_same_len(o, lo + 1, hi + 1, n - 1);
        }
        return;
    }
    bool lo_zero = true, hi_nine = true;
    for (int i = 1; i < n; i++)
        lo_zero &= lo[i] == '0', hi_nine &= hi[i] == '9';
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines), memset(zeros, '0', sizeof zeros);
    int from = lo[0], to = hi[0];
    const char *sep = "";
    strbuf_put(o, "( ", 2);
    if (!lo_zero) { /* lo's first digit, then lo's tail up to 9...9 */
        strbuf_printf(o, "\"%c\" ", lo[0]);
        put_same_len(o, lo + 1, nines, n - 1);
        from++, sep = " | ";
    }
    if (!hi_nine)
        to--;
    if (from <= to) {
        strbuf_printf(o, "%s[%c-%c]", sep, from, to);
        if (n > 1)
            strbuf_printf(o, " [0-9]{%d}", n - 1);
        sep = " | ";
    }
    if (!hi_nine) {
        strbuf_printf(o, "%s\"%c\" ", sep, hi[0]);
        put_same_len(o, zeros, hi + 1, n - 1);
    }
    strbuf_put(o, " )", 2);
}

/* ( ... ) matching the decimal integers in [a, b] written without leading zeros,
   0 <= a <= b <= NUM_LIM. */
static void put_uint_range(struct strbuf *o, long long a, long long b)
{
    strbuf_put(o, "( ", 2);
    long long p = 1;
    const char *sep = "";
    for (int d = 1; d <= 16; d++, p *= 10) {
        long long lo = d == 1 ? 0 : p, hi = p * 10 - 1;
        lo = a > lo ? a : lo, hi = b < hi ? b : hi;
        if (lo > hi)
            continue;
        char ls[24], hs[24];
        snprintf(ls, sizeof ls, "%lld", lo), snprintf(hs, sizeof hs, "%lld", hi);
        strbuf_put(o, sep, strlen(sep));
        put_same_len(o, ls, hs, d);
        sep = " | ";
    }
    strbuf_put(o, " )", 2);
}

/* A bound keyword's value, as an integer (whole when must_whole, else rounded up for a
   minimum, down for a maximum). 1: absent, 0: set, -1: refused. */
static int get_bound(struct conv *c, const json_t *s, const char *key, bool is_min, bool integer,
                     const char *path, long long *out)
{
    const json_t *v = json_object_get(s, key);
    if (!v)
        return 1;
    if (!json_is_number(v))
        return refuse(c, path, "\"%s\" must be a number", key), -1;
    double x = json_number_value(v);
    if (!(x > -1e16 && x < 1e16))
        return refuse(c, path, "\"%s\" %g is beyond 16 digits", key, x), -1;
    const bool excl = key[0] == 'e';
    if (!integer && (excl || x != (double)(long long)x))
        return refuse(c, path, "\"%s\" %g on a number is not supported (whole minimum and "
                      "maximum are; any bound on an integer is)", key, x), -1;
    double r = is_min ? ceil(x) : floor(x);
    long long k = (long long)r;
    if (excl && r == x)
        k += is_min ? 1 : -1;
    *out = k;
    return 0;
}

/* An integer or number with minimum / maximum / exclusive bounds: -1 refused, 0 none given
   (the plain rule), else the new rule's id + 1. */
static int bounded_rule(struct conv *c, const json_t *s, bool integer, const char *path)
{
    long long lo = -NUM_LIM, hi = NUM_LIM, v;
    int got = 0, r;
    const char *mins[] = {"minimum", "exclusiveMinimum"}, *maxs[] = {"maximum", "exclusiveMaximum"};
    for (int i = 0; i < 2; i++) {
        if ((r = get_bound(c, s, mins[i], true, integer, path, &v)) < 0)
            return -1;
        if (!r)
            lo = v > lo ? v : lo, got = 1;
        if ((r = get_bound(c, s, maxs[i], false, integer, path, &v)) < 0)
            return -1;
        if (!r)
            hi = v < hi ? v : hi, got = 1;
    }
    if (!got)
        return 0;
    lo = lo < -NUM_LIM ? -NUM_LIM : lo, hi = hi > NUM_LIM ? NUM_LIM : hi;
    if (lo > hi)
        return refuse(c, path, "no %s lies between the bounds", integer ? "integer" : "number"),
               -1;
    int id = c->n_rules++;
    struct strbuf *o = &c->o;
    const char *frac = "( \".\" [0-9]{1,16} )";
    const char *sep = "";
    strbuf_printf(o, "r%d ::= ", id);
    if (hi >= 0) { /* 0 .. hi (from lo when lo > 0) */
        long long a = lo > 0 ? lo : 0;
        if (integer || a == hi) {
            put_uint_range(o, a, hi);
        } else {
            put_uint_range(o, a, hi - 1);
            strbuf_printf(o, " %s? | ", frac);
            put_uint_range(o, hi, hi);
        }
        sep = " | ";
    }
    if (lo < 0) { /* -1 .. lo; a number's -k.f lies in (-k-1, -k] */
        long long k0 = hi >= 0 ? 1 : -hi;
        if (k0 <= -lo) {
            strbuf_printf(o, "%s\"-\" ", sep);
            put_uint_range(o, k0, -lo);
            sep = " | ";
        }
        long long f0 = hi >= 0 ? 0 : -hi, f1 = -lo - 1;
        if (!integer && f0 <= f1) {
            strbuf_printf(o, "%s\"-\" ", sep);
            put_uint_range(o, f0, f1);
            strbuf_printf(o, " %s", frac);
        }
    }
    strbuf_put(o, "\n", 1);
    return id + 1;
}

static int type_rule(struct conv *c, const json_t *s, const char *type, const char *path, int depth)
{
    static const struct {
        const char *name;
        enum prim p;
    } simple[] = {{"number", P_NUMBER},
                  {"integer", P_INTEGER},
                  {"boolean", P_BOOLEAN},
                  {"null", P_NULL}};
    if (!strcmp(type, "object"))
        return object_rule(c, s, path, depth);
    if (!strcmp(type, "array"))
        return array_rule(c, s, path, depth);
    if (!strcmp(type, "string"))
        return string_rule(c, s, path);
    if (!strcmp(type, "integer") || !strcmp(type, "number")) {
        int b = bounded_rule(c, s, type[0] == 'i', path);
        if (b != 0)
            return b < 0 ? -1 : b - 1;
    }
    for (size_t i = 0; i < sizeof simple / sizeof *simple; i++)
        if (!strcmp(type, simple[i].name)) {
            use(c, simple[i].p);
            int id = c->n_rules++;
            strbuf_printf(&c->o, "r%d ::= %s\n", id, prim_name[simple[i].p]);
            return id;
        }
    return refuse(c, path, "type \"%s\" is not a JSON Schema type", type), -1;
}

int grammar_gbnf_from_json_schema(const char *text, size_t len, char **gbnf, struct weld_err *e)
{
    return grammar_gbnf_json_schema_rule(text, len, "root", gbnf, e);
}

int grammar_gbnf_json_schema_rule(const char *text, size_t len, const char *rule, char **gbnf,
                                  struct weld_err *e)
{
    return grammar_gbnf_json_schema_ex(text, len, rule, NULL, gbnf, e);
}

int grammar_gbnf_json_schema_ex(const char *text, size_t len, const char *rule,
                                const struct schema_opts *opts, char **gbnf, struct weld_err *e)
{
    *gbnf = NULL;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_DECODE_ANY, &je);
    if (!root)
        return err_set(e, WELD_ERR_INVALID_ARG, "json_schema: not JSON (line %d, column %d: %s)",
                       je.line, je.column, je.text);
    struct conv c = {.root = root, .e = e};
    if (opts)
        c.opt = *opts;
    int top = schema_rule(&c, root, "", 0);
    if (top >= 0 && !c.rc) {
        use(&c, P_WS);
        strbuf_printf(&c.o, "%s ::= ws r%d ws\n", rule, top);
        for (int p = 0; p < P_N; p++)
            if (c.used >> p & 1)
                strbuf_printf(&c.o, "%s ::= %s\n", prim_name[p],
                              p == P_WS && c.opt.no_whitespace ? "\"\"" : prim_rule[p]);
    }
    json_decref(root);
    if (!c.rc && c.o.oom)
        c.rc = err_set(e, WELD_ERR_NOMEM, "json_schema: out of memory");
    if (!c.rc) { /* a $ref cycle with nothing between (a schema that is only itself) */
        struct grammar *g = NULL;
        if (grammar_parse_gbnf(&g, c.o.p, c.o.n, rule, e) != WELD_OK) {
            char why[sizeof e->msg];
            snprintf(why, sizeof why, "%s", e->msg);
            c.rc = err_set(e, WELD_ERR_INVALID_ARG,
                           "json_schema: no document satisfies it, or a $ref cycle consumes "
                           "nothing (%s)",
                           why);
        }
        grammar_free(g);
    }
    if (c.rc) {
        wfree(c.o.p);
        return c.rc;
    }
    *gbnf = c.o.p;
    return WELD_OK;
}
