/*
 * psbatch's decision for a Megatron job, made in C: what pipeswift_slurm/submit/psbatch.py's
 * decide() hands sbatch, for the common case, so that a Megatron script the resident
 * helper has not seen costs about what a plain job costs (no round trip to Python).
 *
 * It follows the Python step by step (psbatch.plan_job; jobscript's reading of the
 * script; sbatch_args' options and GPU request; megatron's parsing and validity rules;
 * token.encode_profile) and gives up (-1) at the first doubt: bytes Python reads
 * otherwise than ASCII (control characters, Unicode blanks; non-ASCII in a number or a
 * recorded word), a number that is not plain digits, anything Python would refuse or warn
 * about (invalid Megatron arguments, heterogeneous jobs, an #SBATCH line that Slurm
 * versions read differently, shell text shlex cannot split). Giving up costs only time:
 * the helper or the Python psbatch then decides, as before. The unit tests hold the two
 * to the same outcome on random submissions.
 *
 * Flag names, word lists and option tables come from psbatch_tables.h, generated from
 * the Python modules (pipeswift_slurm/submit/fast/build.py). The rules are copied by hand: this
 * file copies the Python at fingerprint 006b3177015a0b16, which a unit test compares with
 * the Python's sources (test_decide_c_was_reviewed_against_the_python_it_copies), so that
 * a change there is carried here too. Nothing is freed: the process execs sbatch right
 * after deciding.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decide.h"
#include "psbatch_tables.h"

#define GIVE_UP (-1)
#define MAX_DIGITS 9          /* numbers up to 999,999,999: no overflow anywhere below */
#define MAX_LAYOUT 1000000LL  /* tp, pp, cp, micro-batch, GPUs: more is not a common case */
#define MAX_RAMP_STEPS 100000LL

/* ------------------------------------------------------------------ text */

struct str {
    char *p;
    size_t n, cap;
};

struct strs {
    struct str *v;
    size_t n, cap;
};

/* The array `items` (*cap elements of `size` bytes, n used) with room for one more;
 * NULL when out of memory. */
static void *room(void *items, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return items;
    *cap = *cap ? 2 * *cap : 8;
    return realloc(items, *cap * size);
}

static int str_add(struct str *s, const char *p, size_t n)
{
    if (s->n + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 32;
        char *grown;
        while (cap < s->n + n + 1)
            cap *= 2;
        if ((grown = realloc(s->p, cap)) == NULL)
            return GIVE_UP;
        s->p = grown;
        s->cap = cap;
    }
    if (n)
        memcpy(s->p + s->n, p, n);
    s->n += n;
    s->p[s->n] = '\0';
    return 0;
}

static int str_addc(struct str *s, char c)
{
    return str_add(s, &c, 1);
}

/* Append `s` itself (the list owns it from now on). */
static int strs_take(struct strs *l, struct str s)
{
    if ((l->v = room(l->v, &l->cap, l->n, sizeof *l->v)) == NULL)
        return GIVE_UP;
    l->v[l->n++] = s;
    return 0;
}

static int strs_push(struct strs *l, const char *p, size_t n)
{
    struct str s = {NULL, 0, 0};
    return str_add(&s, p, n) ? GIVE_UP : strs_take(l, s);
}

static int strs_extend(struct strs *l, const struct strs *more)
{
    size_t k;
    for (k = 0; k < more->n; k++)
        if (strs_push(l, more->v[k].p, more->v[k].n))
            return GIVE_UP;
    return 0;
}

static int starts_with(const char *p, size_t n, const char *prefix)
{
    size_t k = strlen(prefix);
    return n >= k && memcmp(p, prefix, k) == 0;
}

static int equals(const char *p, size_t n, const char *word)
{
    return strlen(word) == n && memcmp(p, word, n) == 0;
}

static int in_list(const char *p, size_t n, const char *const *list)
{
    for (; *list; list++)
        if (equals(p, n, *list))
            return 1;
    return 0;
}

/* Python's blanks, on text that passed odd(): str.split, str.strip and re's \s. */
static int blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n';
}

/* Bytes Python reads otherwise than this file does: control characters other than tab
 * and newline (str.split also splits at \r, \v, \f and \x1c-\x1f), and the UTF-8 of the
 * Unicode blanks str.isspace knows (U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028,
 * U+2029, U+202F, U+205F, U+3000). */
static int odd(const char *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        unsigned char d = i + 1 < n ? (unsigned char)p[i + 1] : 0, e = i + 2 < n ? (unsigned char)p[i + 2] : 0;
        if (c < 0x20 && c != '\t' && c != '\n')
            return 1;
        if ((c == 0xc2 && (d == 0x85 || d == 0xa0)) || (c == 0xe1 && d == 0x9a && e == 0x80) ||
            (c == 0xe2 && d == 0x80 && ((e >= 0x80 && e <= 0x8a) || e == 0xa8 || e == 0xa9 || e == 0xaf)) ||
            (c == 0xe2 && d == 0x81 && e == 0x9f) || (c == 0xe3 && d == 0x80 && e == 0x80))
            return 1;
    }
    return 0;
}

static int ascii(const char *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if ((unsigned char)p[i] >= 0x80)
            return 0;
    return 1;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int name_char(char c, int first)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || (!first && is_digit(c));
}

/* int() of plain ASCII digits; GIVE_UP for anything else (int() may read more forms:
 * signs, blanks, underscores, other scripts' digits; the caller then gives up). */
static long long digits(const char *p, size_t n)
{
    long long v = 0;
    size_t i;
    if (n == 0 || n > MAX_DIGITS)
        return GIVE_UP;
    for (i = 0; i < n; i++) {
        if (!is_digit(p[i]))
            return GIVE_UP;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

static const char *base_name(const char *p, size_t n, size_t *len)
{
    const char *slash = memrchr(p, '/', n);
    const char *base = slash ? slash + 1 : p;
    *len = n - (size_t)(base - p);
    return base;
}

/* ------------------------------------------------------------------ sbatch's argv */

/* getopt_long's lookup: an exact name, else a unique prefix. NULL: unknown. */
static const struct psb_long *long_option(const char *body, size_t len)
{
    const struct psb_long *hit = NULL;
    int k, hits = 0;
    for (k = 0; psb_long[k].name; k++) {
        if (strncmp(psb_long[k].name, body, len) != 0)
            continue;
        if (psb_long[k].name[len] == '\0')
            return &psb_long[k];
        hit = &psb_long[k];
        hits++;
    }
    return hits == 1 ? hit : NULL;
}

static int scan_long(int n, char *const *w, int i, psb_opt_fn fn, void *ctx)
{
    const char *body = w[i] + 2, *eq = strchr(body, '=');
    size_t len = eq ? (size_t)(eq - body) : strlen(body), own_len = strlen(PSB_OWN_PREFIX) - 2;
    struct psb_opt o = {PSB_OPT_KNOWN, body, len, eq ? eq + 1 : NULL, i, i + 1};
    const struct psb_long *opt;
    if (strncmp(w[i], PSB_OWN_PREFIX, own_len + 2) == 0) {
        o.what = PSB_OPT_OWN;
        if (!eq && len != own_len && i + 1 < n) { /* --pipeswift-KEY VALUE */
            o.value = w[i + 1];
            o.end = i + 2;
        }
    } else if ((opt = long_option(body, len)) == NULL) {
        o.what = PSB_OPT_UNKNOWN;
    } else {
        o.name = opt->name;
        o.name_len = strlen(opt->name);
        if (!eq && opt->kind == PSB_REQUIRED && i + 1 < n) {
            o.value = w[i + 1];
            o.end = i + 2;
        }
    }
    fn(&o, ctx);
    return o.end;
}

static int scan_short(int n, char *const *w, int i, psb_opt_fn fn, void *ctx)
{
    const char *text = w[i];
    size_t k;
    for (k = 1; text[k]; k++) {
        unsigned char c = (unsigned char)text[k];
        const struct psb_short *opt = c < 128 ? &psb_short[c] : NULL;
        struct psb_opt o = {PSB_OPT_UNKNOWN, NULL, 0, NULL, i, i + 1};
        if (opt && opt->name) {
            o.what = PSB_OPT_KNOWN;
            o.name = opt->name;
            o.name_len = strlen(opt->name);
            if (opt->kind == PSB_REQUIRED) {
                if (text[k + 1]) {
                    o.value = text + k + 1;
                } else if (i + 1 < n) {
                    o.value = w[i + 1];
                    o.end = i + 2;
                }
                fn(&o, ctx);
                return o.end;
            }
        }
        fn(&o, ctx);
    }
    return i + 1;
}

int psb_scan_options(int n, char *const *words, int stop_at_script, psb_opt_fn fn, void *ctx, int *components)
{
    int i = 0, parts = 1, script = -1;
    while (i < n) {
        const char *arg = words[i];
        if (strcmp(arg, ":") == 0) {
            parts++;
            i++;
        } else if (strcmp(arg, "--") == 0) {
            script = i + 1 < n ? i + 1 : -1;
            break;
        } else if (arg[0] == '-' && arg[1] == '-') {
            i = scan_long(n, words, i, fn, ctx);
        } else if (arg[0] == '-' && arg[1] != '\0') {
            i = scan_short(n, words, i, fn, ctx);
        } else if (stop_at_script) {
            script = i;
            break;
        } else {
            i++;
        }
    }
    if (components)
        *components = parts;
    return script;
}

/* ------------------------------------------------------------------ shell words */

/* jobscript.shell_words: shlex.split's words (POSIX mode). 1: shlex would raise (an
 * unclosed quote or a trailing backslash). */
static int shell_words(const char *p, size_t n, struct strs *out)
{
    size_t i = 0;
    for (;;) {
        struct str w = {NULL, 0, 0};
        while (i < n && (blank(p[i]) || p[i] == '\r'))
            i++;
        if (i >= n)
            return 0;
        if (str_add(&w, "", 0))
            return GIVE_UP;
        while (i < n && !(blank(p[i]) || p[i] == '\r')) {
            char c = p[i];
            if (c == '\\') {
                if (i + 1 >= n)
                    return 1;
                if (str_addc(&w, p[i + 1]))
                    return GIVE_UP;
                i += 2;
            } else if (c == '\'') {
                const char *end = memchr(p + i + 1, '\'', n - i - 1);
                if (end == NULL)
                    return 1;
                if (str_add(&w, p + i + 1, (size_t)(end - p) - i - 1))
                    return GIVE_UP;
                i = (size_t)(end - p) + 1;
            } else if (c == '"') {
                size_t j = i + 1;
                for (;;) {
                    if (j >= n)
                        return 1;
                    if (p[j] == '"')
                        break;
                    if (p[j] == '\\') { /* inside "...", a backslash escapes only " and itself */
                        if (j + 1 >= n)
                            return 1;
                        if (p[j + 1] != '\\' && p[j + 1] != '"' && str_addc(&w, '\\'))
                            return GIVE_UP;
                        if (str_addc(&w, p[j + 1]))
                            return GIVE_UP;
                        j += 2;
                    } else {
                        if (str_addc(&w, p[j]))
                            return GIVE_UP;
                        j++;
                    }
                }
                i = j + 1;
            } else {
                if (str_addc(&w, c))
                    return GIVE_UP;
                i++;
            }
        }
        if (strs_take(out, w))
            return GIVE_UP;
    }
}

/* jobscript._scan_shell: whether the text continues on the next line, where its segments
 * start (after top-level ; & |), and the text without comments. */
struct scanned {
    int incomplete;
    size_t *starts;
    size_t n_starts, cap;
    struct str kept;
};

static int add_start(struct scanned *s, size_t at)
{
    if ((s->starts = room(s->starts, &s->cap, s->n_starts, sizeof *s->starts)) == NULL)
        return GIVE_UP;
    s->starts[s->n_starts++] = at;
    return 0;
}

static int scan_shell(const char *t, size_t n, struct scanned *s)
{
    char quote = 0;
    int depth = 0;
    size_t i = 0;
    s->n_starts = 0;
    s->kept.n = 0;
    s->incomplete = 0;
    if (add_start(s, 0) || str_add(&s->kept, "", 0))
        return GIVE_UP;
    while (i < n) {
        char c = t[i];
        if (quote) {
            if (c == '\\' && quote == '"' && i + 1 < n) {
                if (str_add(&s->kept, t + i, 2))
                    return GIVE_UP;
                i += 2;
                continue;
            }
            if (c == quote)
                quote = 0;
        } else if (c == '\\') {
            if (i + 1 >= n) {
                s->incomplete = 1;
                return 0;
            }
            if (str_add(&s->kept, t + i, 2))
                return GIVE_UP;
            i += 2;
            continue;
        } else if (c == '\'' || c == '"' || c == '`') {
            quote = c;
        } else if (c == '#' && (i == 0 || strchr(" \t\n;&|(", t[i - 1]))) {
            const char *nl = memchr(t + i, '\n', n - i);
            i = nl ? (size_t)(nl - t) : n;
            continue;
        } else if (c == '(') {
            depth++;
        } else if (c == ')') {
            depth = depth > 0 ? depth - 1 : 0;
        } else if ((c == ';' || c == '&' || c == '|') && depth == 0) {
            while (i + 1 < n && (t[i + 1] == ';' || t[i + 1] == '&' || t[i + 1] == '|')) {
                if (str_addc(&s->kept, c))
                    return GIVE_UP;
                i++;
            }
            if (add_start(s, i + 1))
                return GIVE_UP;
        }
        if (str_addc(&s->kept, c))
            return GIVE_UP;
        i++;
    }
    s->incomplete = quote || depth > 0;
    return 0;
}

/* ------------------------------------------------------------------ shell variables */

struct var {
    struct str name;
    struct strs words;
};

struct vars {
    struct var *v;
    size_t n, cap;
    struct strs env_words; /* the last variable read from the environment, split */
};

/* A variable's words (jobscript._Vars.get): the script's own assignment, else the submit
 * environment's value split at blanks. *out NULL: unknown. */
static int var_get(struct vars *vs, const char *name, size_t len, const struct strs **out)
{
    size_t k;
    char key[256];
    const char *value;
    *out = NULL;
    for (k = vs->n; k-- > 0;)
        if (vs->v[k].name.n == len && memcmp(vs->v[k].name.p, name, len) == 0) {
            *out = &vs->v[k].words;
            return 0;
        }
    if (len >= sizeof key)
        return GIVE_UP;
    memcpy(key, name, len);
    key[len] = '\0';
    if ((value = getenv(key)) == NULL)
        return 0;
    if (odd(value, strlen(value)))
        return GIVE_UP;
    vs->env_words.n = 0;
    while (*value) {
        size_t m;
        while (blank(*value))
            value++;
        for (m = 0; value[m] && !blank(value[m]); m++)
            ;
        if (m && strs_push(&vs->env_words, value, m))
            return GIVE_UP;
        value += m;
    }
    *out = &vs->env_words;
    return 0;
}

/* A $NAME, ${NAME}, ${NAME[@]} or ${NAME[*]} at w[i] (w[i] == '$'): its length (0: none)
 * and the name. */
static size_t var_ref(const char *w, size_t n, size_t i, const char **name, size_t *name_len)
{
    size_t j = i + 1, k;
    int braced = j < n && w[j] == '{';
    if (braced)
        j++;
    if (j >= n || !name_char(w[j], 1))
        return 0;
    for (k = j + 1; k < n && name_char(w[k], 0); k++)
        ;
    *name = w + j;
    *name_len = k - j;
    if (!braced)
        return k - i;
    if (k + 2 < n && w[k] == '[' && (w[k + 1] == '@' || w[k + 1] == '*') && w[k + 2] == ']')
        k += 3;
    return k < n && w[k] == '}' ? k + 1 - i : 0;
}

/* jobscript._expand: a word that is exactly one known variable becomes its words; known
 * variables inside a word become their words joined by blanks; others stay as written. */
static int expand(struct vars *vs, const struct strs *in, struct strs *out)
{
    size_t k;
    for (k = 0; k < in->n; k++) {
        const char *w = in->v[k].p, *name;
        size_t n = in->v[k].n, i, len, name_len;
        const struct strs *known;
        struct str joined = {NULL, 0, 0};
        if (memchr(w, '$', n) == NULL) {
            if (strs_push(out, w, n))
                return GIVE_UP;
            continue;
        }
        if (w[0] == '$' && var_ref(w, n, 0, &name, &name_len) == n) {
            if (var_get(vs, name, name_len, &known))
                return GIVE_UP;
            if (known) {
                if (strs_extend(out, known))
                    return GIVE_UP;
                continue;
            }
        }
        if (str_add(&joined, "", 0))
            return GIVE_UP;
        for (i = 0; i < n;) {
            if (w[i] != '$' || (len = var_ref(w, n, i, &name, &name_len)) == 0) {
                if (str_addc(&joined, w[i++]))
                    return GIVE_UP;
                continue;
            }
            if (var_get(vs, name, name_len, &known))
                return GIVE_UP;
            if (known && known->n) {
                size_t m;
                for (m = 0; m < known->n; m++)
                    if ((m && str_addc(&joined, ' ')) || str_add(&joined, known->v[m].p, known->v[m].n))
                        return GIVE_UP;
            } else if (str_add(&joined, w + i, len)) {
                return GIVE_UP;
            }
            i += len;
        }
        if (strs_push(out, joined.p, joined.n))
            return GIVE_UP;
    }
    return 0;
}

/* jobscript._record_assignment: remember X=value, export X=value and X=( ... ); 1 if the
 * command is one. */
static int record_assignment(struct vars *vs, const struct strs *words)
{
    const struct str *v = words->v;
    size_t first = 0, n = words->n, k, name_len;
    const char *w, *eq;
    struct strs raw = {NULL, 0, 0}, value = {NULL, 0, 0};
    struct var *slot = NULL;
    /* past export, declare, ... and their own options (declare -a, export -n) */
    while (first < n && in_list(v[first].p, v[first].n, psb_assign_commands))
        for (first++; first < n && v[first].p[0] == '-'; first++)
            ;
    if (first >= n)
        return 0;
    w = v[first].p;
    if (!name_char(w[0], 1))
        return 0;
    for (k = 1; k < v[first].n && name_char(w[k], 0); k++)
        ;
    if (k >= v[first].n || w[k] != '=')
        return 0;
    name_len = k;
    eq = w + k + 1;
    if (*eq == '(') { /* X=( a b c ): the words, without the parentheses */
        for (k = first; k < n; k++) {
            const char *p = k == first ? eq + 1 : v[k].p;
            size_t len = k == first ? v[k].n - name_len - 2 : v[k].n;
            if (k == n - 1 && len && p[len - 1] == ')')
                len--;
            if (len && strs_push(&raw, p, len))
                return GIVE_UP;
        }
    } else if (n - first == 1) { /* X=value: its words */
        const char *p = eq, *end = w + v[first].n;
        while (p < end) {
            size_t m;
            while (p < end && blank(*p))
                p++;
            for (m = 0; p + m < end && !blank(p[m]); m++)
                ;
            if (m && strs_push(&raw, p, m))
                return GIVE_UP;
            p += m;
        }
    } else {
        return 0; /* X=1 cmd ...: an assignment for one command */
    }
    if (expand(vs, &raw, &value))
        return GIVE_UP;
    for (k = 0; k < vs->n; k++)
        if (vs->v[k].name.n == name_len && memcmp(vs->v[k].name.p, w, name_len) == 0)
            slot = &vs->v[k];
    if (slot == NULL) {
        if ((vs->v = room(vs->v, &vs->cap, vs->n, sizeof *vs->v)) == NULL)
            return GIVE_UP;
        slot = &vs->v[vs->n++];
        memset(slot, 0, sizeof *slot);
        if (str_add(&slot->name, w, name_len))
            return GIVE_UP;
    }
    slot->words = value;
    return 1;
}

/* ------------------------------------------------------------------ commands */

/* jobscript._ASSIGN from `at`: NAME=, then quoted runs or characters other than blanks
 * and quotes. The end of the longest match, or 0 when there is none. */
static size_t assign_end(const char *p, size_t n, size_t at)
{
    size_t i = at;
    if (i >= n || !name_char(p[i], 1))
        return 0;
    while (++i < n && name_char(p[i], 0))
        ;
    if (i >= n || p[i] != '=')
        return 0;
    i++;
    while (i < n) {
        if (p[i] == '\'') {
            const char *end = memchr(p + i + 1, '\'', n - i - 1);
            if (end == NULL)
                break;
            i = (size_t)(end - p) + 1;
        } else if (p[i] == '"') {
            size_t j = i + 1;
            while (j < n && p[j] != '"') {
                if (p[j] == '\\') {
                    if (j + 1 >= n || p[j + 1] == '\n') /* re's . takes no newline */
                        break;
                    j++;
                }
                j++;
            }
            if (j >= n || p[j] != '"')
                break;
            i = j + 1;
        } else if (blank(p[i])) {
            break;
        } else {
            i++;
        }
    }
    return i;
}

/* The length of jobscript._PREFIX_RE's match at the start of a segment: blanks,
 * assignments and prefix words (exec, time, ...), each followed by blanks. */
static size_t prefix_end(const char *p, size_t n)
{
    size_t i = 0, end;
    int k;
    while (i < n && blank(p[i]))
        i++;
    while ((end = assign_end(p, n, i)) != 0 && end < n && blank(p[end]))
        for (i = end; i < n && blank(p[i]); i++)
            ;
    for (;;) {
        for (k = 0; psb_prefix_words[k]; k++) {
            size_t len = strlen(psb_prefix_words[k]);
            if (i + len < n && memcmp(p + i, psb_prefix_words[k], len) == 0 && blank(p[i + len]))
                break;
        }
        if (psb_prefix_words[k] == NULL)
            return i;
        for (i += strlen(psb_prefix_words[k]); i < n && blank(p[i]); i++)
            ;
    }
}

static int has_flag(const struct strs *words, const char *flag)
{
    size_t k, len = strlen(flag);
    for (k = 0; k < words->n; k++) {
        const char *w = words->v[k].p;
        if (w[0] == '-' && w[1] == '-' && strncmp(w, flag, len) == 0 && (w[len] == '\0' || w[len] == '='))
            return 1;
    }
    return 0;
}

/* jobscript._PRETRAIN_RE: (^|/)pretrain_[A-Za-z0-9_]*\.py$ ($ also before a last newline) */
static int runs_pretrain(const char *w, size_t n)
{
    const char *at = w;
    while ((at = memmem(at, n - (size_t)(at - w), "pretrain_", 9)) != NULL) {
        const char *q = at + 9, *end = w + n;
        if (at == w || at[-1] == '/') {
            while (q < end && name_char(*q, 0))
                q++;
            if (equals(q, (size_t)(end - q), ".py") || equals(q, (size_t)(end - q), ".py\n"))
                return 1;
        }
        at++;
    }
    return 0;
}

/* jobscript.is_training_command */
static int is_training_command(const struct strs *words)
{
    size_t k, len;
    const char *base;
    int all = 1, any = 0, launcher = 0;
    if (words->n == 0)
        return 0;
    base = base_name(words->v[0].p, words->v[0].n, &len);
    if (in_list(base, len, psb_not_commands))
        return 0;
    for (k = 0; psb_shape_flags[k]; k++) {
        int has = has_flag(words, psb_shape_flags[k]);
        all &= has;
        any |= has;
    }
    if (all)
        return 1;
    for (k = 0; k < words->n; k++)
        if (runs_pretrain(words->v[k].p, words->v[k].n))
            return 1;
    for (k = 0; k < words->n && k < 4; k++) {
        base = base_name(words->v[k].p, words->v[k].n, &len);
        launcher |= in_list(base, len, psb_launchers);
    }
    return launcher && any;
}

/* The training command: where a launcher prefix goes (a byte offset into the script) and
 * its words, variables expanded. */
struct command {
    size_t at;
    struct strs words;
};

/* One segment of a logical line (text[from, to) of the script): 1 with `cmd` filled when
 * it is the training command. */
static int segment_command(const char *seg, size_t seg_len, const struct str *code_in, struct vars *vs,
                           size_t seg_at, struct command *cmd)
{
    struct str code = {NULL, 0, 0};
    struct strs words = {NULL, 0, 0}, expanded = {NULL, 0, 0};
    size_t i, skip = 0;
    int rc;
    for (i = 0; i < code_in->n; i++) { /* .replace("\\\n", " ") */
        if (code_in->p[i] == '\\' && i + 1 < code_in->n && code_in->p[i + 1] == '\n') {
            rc = str_addc(&code, ' ');
            i++;
        } else {
            rc = str_addc(&code, code_in->p[i]);
        }
        if (rc)
            return GIVE_UP;
    }
    if ((rc = shell_words(code.p ? code.p : "", code.n, &words)) != 0)
        return rc == 1 ? 0 : GIVE_UP; /* shlex would raise: jobscript skips the segment */
    if (words.n == 0)
        return 0;
    if ((rc = record_assignment(vs, &words)) != 0)
        return rc == 1 ? 0 : GIVE_UP;
    if (expand(vs, &words, &expanded))
        return GIVE_UP;
    while (skip < expanded.n && (in_list(expanded.v[skip].p, expanded.v[skip].n, psb_prefix_words) ||
                                 assign_end(expanded.v[skip].p, expanded.v[skip].n, 0) == expanded.v[skip].n))
        skip++;
    expanded.v += skip; /* jobscript._strip_prefix: the words from the command's name on */
    expanded.n -= skip;
    expanded.cap = expanded.n; /* a view into the list: it grows no more */
    if (!is_training_command(&expanded))
        return 0;
    cmd->at = seg_at + prefix_end(seg, seg_len);
    cmd->words = expanded;
    return 1;
}

static size_t strip_end(const char *p, size_t n)
{
    while (n && blank(p[n - 1]))
        n--;
    return n;
}

static size_t strip_start(const char *p, size_t n)
{
    size_t i = 0;
    while (i < n && blank(p[i]))
        i++;
    return i;
}

/* The word a heredoc ends at, when the logical line `t` starts one: jobscript._HEREDOC_RE
 * (<<-?\s*['"]?NAME), looked for only without "<<<". */
static int heredoc_tag(const char *t, size_t n, const char **name, size_t *len)
{
    const char *at = t, *end = t + n;
    if (memmem(t, n, "<<<", 3))
        return 0;
    while ((at = memmem(at, (size_t)(end - at), "<<", 2)) != NULL) {
        const char *q = at + 2;
        if (q < end && *q == '-')
            q++;
        while (q < end && blank(*q))
            q++;
        if (q < end && (*q == '\'' || *q == '"'))
            q++;
        if (q < end && name_char(*q, 1)) {
            *name = q;
            while (q < end && name_char(*q, 0))
                q++;
            *len = (size_t)(q - *name);
            return 1;
        }
        at++;
    }
    return 0;
}

/* jobscript.find_training_command over the script's lines (line k is text[ls[k],
 * ls[k+1] - 1)): 1 with `cmd` filled, 0 when there is none. */
static int find_training_command(const char *text, const size_t *ls, size_t n_lines, struct command *cmd)
{
    struct vars vs;
    struct scanned whole, part;
    size_t i = 0;
    memset(&vs, 0, sizeof vs);
    memset(&whole, 0, sizeof whole);
    memset(&part, 0, sizeof part);
    while (i < n_lines) {
        size_t j = i + 1, from = ls[i], to = ls[j] - 1, k;
        const char *t = text + from, *tag;
        size_t tag_len = 0;
        if (scan_shell(t, to - from, &whole))
            return GIVE_UP;
        while (whole.incomplete && j < n_lines && j - i < PSB_MAX_LOGICAL_LINES) {
            to = ls[++j] - 1;
            if (scan_shell(t, to - from, &whole))
                return GIVE_UP;
        }
        for (k = 0; k < whole.n_starts; k++) {
            size_t start = whole.starts[k], end = k + 1 < whole.n_starts ? whole.starts[k + 1] - 1 : to - from;
            const struct str *code = &whole.kept;
            int rc;
            if (end < start)
                end = start;
            if (whole.n_starts > 1) {
                if (scan_shell(t + start, end - start, &part))
                    return GIVE_UP;
                code = &part.kept;
            }
            rc = segment_command(t + start, end - start, code, &vs, from + start, cmd);
            if (rc)
                return rc;
        }
        if (heredoc_tag(t, to - from, &tag, &tag_len)) { /* skip its body and the line that ends it */
            for (; j < n_lines; j++) {
                const char *line = text + ls[j];
                size_t len = ls[j + 1] - 1 - ls[j], s = strip_start(line, len);
                if (strip_end(line + s, len - s) == tag_len && memcmp(line + s, tag, tag_len) == 0)
                    break;
            }
            j++;
        }
        i = j;
    }
    return 0;
}

/* ------------------------------------------------------------------ the script's header */

struct header {
    struct strs words;  /* #SBATCH words (of the first component) */
    struct strs own;    /* #PSWIFT pairs: key, value, key, value, ... */
    int het, version_dependent;
};

/* jobscript.split_directive: an #SBATCH line's words as sbatch splits them. */
static int split_directive(const char *p, size_t n, struct strs *out, int *differs)
{
    size_t i = 0;
    for (;;) {
        struct str word = {NULL, 0, 0};
        char quote = 0;
        int escaped = 0;
        while (i < n && blank(p[i]))
            i++;
        while (i < n && (quote || !blank(p[i]))) {
            char c = p[i++];
            if (escaped) {
                escaped = 0;
            } else if (c == '\\') {
                escaped = 1;
                continue;
            } else if (quote) {
                if (c == quote) {
                    quote = 0;
                    continue;
                }
            } else if (c == '\'' || c == '"') {
                quote = c;
                continue;
            } else if (c == '#') {
                return word.n && strs_push(out, word.p, word.n) ? GIVE_UP : 0;
            }
            if (str_addc(&word, c))
                return GIVE_UP;
        }
        *differs |= escaped && i < n;
        if (quote || word.n == 0)
            return 0;
        if (strs_push(out, word.p, word.n))
            return GIVE_UP;
    }
}

/* The length of jobscript._DIRECTIVE_RE's match at the start of a line (0: none). */
static size_t directive(const char *line, size_t len)
{
    return starts_with(line, len, "#SBATCH") ? 7 : starts_with(line, len, "#SLURM") ? 6 : 0;
}

/* jobscript.read_header; GIVE_UP for #PSWIFT lines this file does not split as shlex does. */
static int read_header(const char *text, const size_t *ls, size_t n_lines, struct header *h)
{
    size_t k;
    int in_header = 1;
    for (k = 0; k < n_lines; k++) {
        const char *line = text + ls[k];
        size_t len = ls[k + 1] - 1 - ls[k], s = strip_start(line, len);
        const char *stripped = line + s;
        size_t stripped_len = strip_end(stripped, len - s), magic = 0;
        if (starts_with(stripped, stripped_len, "#PSWIFT")) {
            struct strs words = {NULL, 0, 0};
            size_t m;
            const char *rest = stripped + 7;
            size_t rest_len = stripped_len - 7;
            if (memchr(rest, '#', rest_len) || shell_words(rest, rest_len, &words))
                return GIVE_UP; /* shlex with comments, or shlex's fallback */
            for (m = 0; m < words.n; m++) {
                const char *w = words.v[m].p, *eq = memchr(w, '=', words.v[m].n);
                int onoff = !eq && (strcmp(w, "on") == 0 || strcmp(w, "off") == 0);
                if (onoff ? strs_push(&h->own, "", 0) || strs_push(&h->own, w, words.v[m].n)
                          : strs_push(&h->own, w, eq ? (size_t)(eq - w) : words.v[m].n) ||
                            strs_push(&h->own, eq ? eq + 1 : "", eq ? words.v[m].n - (size_t)(eq - w) - 1 : 0))
                    return GIVE_UP;
            }
        } else if (in_header && (magic = directive(line, len)) != 0) {
            struct strs words = {NULL, 0, 0};
            if (split_directive(line + magic, len - magic, &words, &h->version_dependent))
                return GIVE_UP;
            if (words.n && (strcmp(words.v[0].p, "hetjob") == 0 || strcmp(words.v[0].p, "packjob") == 0))
                h->het = 1;
            else if (strs_extend(&h->words, &words))
                return GIVE_UP;
        } else if (stripped_len && stripped[0] != '#') {
            in_header = 0;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ psbatch's own options */

struct own {
    int off, declared, has_gpus, has_class;
    long long gpus_lo, gpus_hi, min_micro_batch;
    struct str pp, job_class; /* as written (digits and commas), class filtered */
};

/* sbatch_args.own_options over (key, value) pairs; GIVE_UP where Python raises or where
 * int() might read what this file does not. */
static int own_options(const struct strs *pairs, struct own *o)
{
    size_t k;
    memset(o, 0, sizeof *o);
    o->declared = pairs->n > 0;
    for (k = 0; k + 1 < pairs->n; k += 2) {
        const char *key = pairs->v[k].p, *value = pairs->v[k + 1].p;
        size_t n = pairs->v[k + 1].n;
        if (*key == '\0') {
            if (strcmp(value, "on") != 0 && strcmp(value, "off") != 0)
                return GIVE_UP;
            o->off = strcmp(value, "off") == 0;
        } else if (strcmp(key, "gpus") == 0) {
            const char *dash = memchr(value, '-', n);
            size_t lo_len = dash ? (size_t)(dash - value) : n;
            o->gpus_lo = digits(value, lo_len);
            o->gpus_hi = dash && dash[1] ? digits(dash + 1, n - lo_len - 1) : o->gpus_lo;
            if (o->gpus_lo < 1 || o->gpus_hi < o->gpus_lo)
                return GIVE_UP;
            o->has_gpus = 1;
        } else if (strcmp(key, "min-micro-batch") == 0) {
            if ((o->min_micro_batch = digits(value, n)) < 0)
                return GIVE_UP;
        } else if (strcmp(key, "pp") == 0) {
            const char *p = value, *end = value + n;
            o->pp.n = 0;
            for (;;) {
                const char *comma = memchr(p, ',', (size_t)(end - p));
                const char *stop = comma ? comma : end;
                long long v = digits(p, (size_t)(stop - p));
                char number[32];
                if (v < 0)
                    return GIVE_UP;
                snprintf(number, sizeof number, "%s%lld", o->pp.n ? "," : "", v);
                if (str_add(&o->pp, number, strlen(number)))
                    return GIVE_UP;
                if (comma == NULL)
                    break;
                p = comma + 1;
            }
        } else if (strcmp(key, "class") == 0) {
            size_t m;
            if (!ascii(value, n))
                return GIVE_UP;
            o->has_class = n > 0;
            o->job_class.n = 0;
            for (m = 0; m < n; m++)
                if ((name_char(value[m], 0) || value[m] == '-' || value[m] == '.') && str_addc(&o->job_class, value[m]))
                    return GIVE_UP;
        } else {
            return GIVE_UP;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ the GPU request */

/* The sbatch options requested_world reads, resolved as effective_options does:
 * script header < environment < command line (the last one wins). */
static const char *const wanted_options[] = {"nodes", "gpus-per-node", "gres", "gpus", "gpus-per-task",
                                             "ntasks", "ntasks-per-node", "comment", NULL};
enum { O_NODES, O_GPN, O_GRES, O_GPUS, O_GPT, O_NTASKS, O_NTPN, O_COMMENT, N_WANTED };

struct values {
    int set[N_WANTED];
    const char *value[N_WANTED];
    /* the command line's --comment and --wrap words, which plan_job replaces */
    unsigned char *drop;
    int has_wrap;
};

static void take_value(const struct psb_opt *o, void *ctx)
{
    struct values *v = ctx;
    int k;
    if (o->what != PSB_OPT_KNOWN)
        return;
    for (k = 0; wanted_options[k]; k++)
        if (strcmp(o->name, wanted_options[k]) == 0) {
            v->set[k] = 1;
            v->value[k] = o->value;
        }
    if (v->drop && (strcmp(o->name, "comment") == 0 || strcmp(o->name, "wrap") == 0)) {
        int i;
        for (i = o->start; i < o->end; i++)
            v->drop[i] = 1;
        v->has_wrap |= strcmp(o->name, "wrap") == 0;
    }
}

/* sbatch_args.effective_options: the values requested_world reads, script header <
 * environment < command line (sbatch's argv without psbatch's own options, whose
 * --comment and --wrap words `v` marks to drop); `components`: the command line's het
 * components. */
static int effective_values(const struct header *h, char **argv, int n, struct values *v, int *components)
{
    static const char *const env_options[][2] = {{"SBATCH_GPUS", "gpus"}, {"SBATCH_GPUS_PER_NODE", "gpus-per-node"},
                                                 {"SBATCH_GPUS_PER_TASK", "gpus-per-task"}, {"SBATCH_GRES", "gres"}};
    char **header = malloc((h->words.n + 1) * sizeof *header);
    size_t k;
    memset(v, 0, sizeof *v);
    if (header == NULL)
        return GIVE_UP;
    for (k = 0; k < h->words.n; k++)
        header[k] = h->words.v[k].p;
    psb_scan_options((int)h->words.n, header, 0, take_value, v, NULL);
    for (k = 0; k < sizeof env_options / sizeof env_options[0]; k++) {
        const char *value = getenv(env_options[k][0]);
        struct psb_opt o = {PSB_OPT_KNOWN, env_options[k][1], 0, value, 0, 0};
        if (value && *value)
            take_value(&o, v);
    }
    if ((v->drop = calloc((size_t)n + 1, 1)) == NULL)
        return GIVE_UP;
    psb_scan_options(n, argv, 1, take_value, v, components);
    return 0;
}

/* sbatch_args._count: the number at the end of "[type:]N"; 0 when absent or unreadable
 * (Python's None and 0 alike: every caller takes both as "not given"). */
static long long count(const char *text)
{
    size_t n, s, end;
    if (text == NULL)
        return 0;
    n = strlen(text);
    s = strip_start(text, n);
    end = s + strip_end(text + s, n - s);
    n = end;
    while (n > s && is_digit(text[n - 1]))
        n--;
    return n < end ? digits(text + n, end - n) : 0;
}

/* The leading digits of text (re.match(r"\d+")); 0 when none. */
static long long leading(const char *text, size_t len)
{
    size_t n = 0;
    while (n < len && is_digit(text[n]))
        n++;
    return n ? digits(text, n) : 0;
}

/* sbatch_args._gres_gpus: GPUs per node of a --gres value; 0 when it names none. */
static long long gres_gpus(const char *text)
{
    while (text && *text) {
        const char *comma = strchr(text, ','), *end = comma ? comma : text + strlen(text), *last;
        size_t s = strip_start(text, (size_t)(end - text));
        const char *item = text + s, *colon;
        size_t len = strip_end(item, (size_t)(end - item));
        colon = memchr(item, ':', len);
        if (equals(item, colon ? (size_t)(colon - item) : len, "gpu") ||
            equals(item, colon ? (size_t)(colon - item) : len, "gres/gpu")) {
            if (colon == NULL)
                return 1;
            last = (const char *)memrchr(item, ':', len) + 1;
            return is_digit(*last) ? leading(last, len - (size_t)(last - item)) : 1;
        }
        text = comma ? comma + 1 : NULL;
    }
    return 0;
}

/* sbatch_args.requested_world: (total GPUs, GPUs per node), 0 for "not given". */
static int requested_world(const struct values *v, long long *world, long long *per_node)
{
    long long nodes = 1, total, per_task, tasks, tasks_per_node;
    int k;
    for (k = 0; k < N_WANTED; k++)
        if (k != O_COMMENT && v->value[k] && (!ascii(v->value[k], strlen(v->value[k])) ||
                                              odd(v->value[k], strlen(v->value[k]))))
            return GIVE_UP; /* \d and str.strip read more than ASCII */
    if (v->value[O_NODES] && is_digit(v->value[O_NODES][0]))
        nodes = leading(v->value[O_NODES], strlen(v->value[O_NODES]));
    if (nodes < 0)
        return GIVE_UP;
    if (nodes < 1)
        nodes = 1;
    *per_node = count(v->value[O_GPN]);
    if (*per_node == 0)
        *per_node = gres_gpus(v->value[O_GRES]);
    total = count(v->value[O_GPUS]);
    per_task = count(v->value[O_GPT]);
    tasks = count(v->value[O_NTASKS]);
    tasks_per_node = count(v->value[O_NTPN]);
    if (*per_node < 0 || total < 0 || per_task < 0 || tasks < 0 || tasks_per_node < 0)
        return GIVE_UP;
    if (total) {
        *world = total;
        *per_node = total % nodes == 0 ? total / nodes : 0;
        return 0;
    }
    if (*per_node) {
        *world = nodes * *per_node;
        return 0;
    }
    if (per_task && !tasks && tasks_per_node)
        tasks = nodes * tasks_per_node;
    if (per_task) {
        *world = per_task * (tasks ? tasks : 1);
        *per_node = *world % nodes == 0 ? *world / nodes : 0;
        return 0;
    }
    *world = *per_node = 0;
    return 0;
}

/* ------------------------------------------------------------------ Megatron's rules */

struct flag_value {
    int set;
    long long n, n3[3];
    const char *s;
};

static int flag_index(const char *p, size_t n)
{
    int k;
    for (k = 0; psb_megatron_flags[k].name; k++)
        if (equals(p, n, psb_megatron_flags[k].name))
            return k;
    return -1;
}

/* megatron.parse_argv: the known flags' values (last one wins). GIVE_UP for a flag
 * without its value, a value of the wrong type, or a number this file does not read. */
static int parse_flags(const struct strs *words, struct flag_value *values)
{
    size_t i = 0;
    while (i < words->n) {
        const char *w = words->v[i].p, *eq = w[0] == '-' && w[1] == '-' ? strchr(w, '=') : NULL;
        int k = flag_index(w, eq ? (size_t)(eq - w) : words->v[i].n), kind, m, nargs;
        size_t width;
        const char *items[3];
        kind = k < 0 ? -1 : psb_megatron_flags[k].kind;
        width = kind < 0 || kind == PSB_MEG_BOOL || eq ? 1 : kind == PSB_MEG_INT3 ? 4 : 2;
        if (k >= 0) {
            struct flag_value *v = &values[k];
            memset(v, 0, sizeof *v);
            v->set = 1;
            nargs = kind == PSB_MEG_INT3 ? 3 : 1;
            if (kind == PSB_MEG_BOOL) {
                if (eq)
                    return GIVE_UP;
            } else {
                if (kind == PSB_MEG_INT3 && eq)
                    return GIVE_UP;
                for (m = 0; m < nargs; m++) {
                    items[m] = eq ? eq + 1 : i + 1 + (size_t)m < words->n ? words->v[i + 1 + (size_t)m].p : NULL;
                    if (items[m] == NULL || (items[m][0] == '-' && items[m][1] == '-') || (eq && m))
                        return GIVE_UP;
                }
                if (kind == PSB_MEG_INT && (v->n = digits(items[0], strlen(items[0]))) < 0)
                    return GIVE_UP;
                for (m = 0; kind == PSB_MEG_INT3 && m < 3; m++)
                    if ((v->n3[m] = digits(items[m], strlen(items[m]))) < 0)
                        return GIVE_UP;
                v->s = items[0];
            }
        }
        i += width;
    }
    return 0;
}

static const struct flag_value *flag(const struct flag_value *values, const char *name)
{
    static const struct flag_value absent = {0, 0, {0, 0, 0}, NULL};
    int k = flag_index(name, strlen(name));
    return k < 0 ? &absent : &values[k];
}

/* megatron._positive: the value, 0 when absent; GIVE_UP when given below 1. */
static long long positive(const struct flag_value *values, const char *name)
{
    const struct flag_value *v = flag(values, name);
    return !v->set ? 0 : v->n < 1 ? GIVE_UP : v->n;
}

/* megatron.stage_layers for the requested layout (first/last: -1 when absent): 0 with
 * the sizes its stages have (one of each), GIVE_UP when the split is invalid. */
static int stage_layers(long long layers, long long pp, long long first, long long last, long long *per_stage,
                        int *n_stages)
{
    long long middle_layers, middle_stages, per;
    if (first < 0 && last < 0) {
        if (layers % pp)
            return GIVE_UP;
        per_stage[0] = layers / pp;
        *n_stages = 1;
        return 0;
    }
    if (pp < 2 || first == 0 || last == 0)
        return GIVE_UP;
    middle_layers = layers - (first > 0 ? first : 0) - (last > 0 ? last : 0);
    middle_stages = pp - (first > 0) - (last > 0);
    if (middle_layers < 0 || (middle_stages == 0 && middle_layers) ||
        (middle_stages && (middle_layers < middle_stages || middle_layers % middle_stages)))
        return GIVE_UP;
    per = middle_stages ? middle_layers / middle_stages : 0;
    /* the stage sizes there are: the first's, the last's, the middle ones' */
    *n_stages = 0;
    if (first > 0)
        per_stage[(*n_stages)++] = first;
    if (last > 0)
        per_stage[(*n_stages)++] = last;
    if (middle_stages)
        per_stage[(*n_stages)++] = per;
    return 0;
}

/* megatron.profile_from_argv + require_length with check_config (job_limits=False):
 * 0 when Megatron would accept the user's own config on `world` GPUs (0: tp*pp*cp). */
static int megatron_valid(const struct strs *words, long long world, long long gpus_per_node)
{
    struct flag_value *v = calloc(PSB_MEGATRON_FLAG_COUNT, sizeof *v);
    long long layers, hidden, heads, seq, kv, groups, max_pos, tp, pp, cp, mbs, dp, iters, samples, gbs, vp = 1;
    long long step, m, nodes, gpn, per_stage[3], first, last;
    int n_stages, k;
    const char *recompute;
    if (v == NULL || parse_flags(words, v) || flag(v, "--model-parallel-size")->set)
        return GIVE_UP;
    for (k = 0; psb_shape_flags[k]; k++)
        if (!flag(v, psb_shape_flags[k])->set)
            return GIVE_UP;
    layers = positive(v, "--num-layers");
    hidden = positive(v, "--hidden-size");
    heads = positive(v, "--num-attention-heads");
    seq = positive(v, "--seq-length");
    kv = positive(v, "--kv-channels");
    if (layers < 0 || hidden < 0 || heads < 0 || seq < 0 || kv < 0 || positive(v, "--ffn-hidden-size") < 0)
        return GIVE_UP;
    if (kv == 0 && hidden % heads)
        return GIVE_UP;
    groups = heads;
    if (flag(v, "--group-query-attention")->set) {
        groups = positive(v, "--num-query-groups");
        if (groups < 0)
            return GIVE_UP;
        groups = groups ? groups : 1;
        if (heads % groups)
            return GIVE_UP;
    }
    max_pos = positive(v, "--max-position-embeddings");
    if (max_pos < 0 || (max_pos ? max_pos : seq) < seq || positive(v, "--vocab-size") < 0 ||
        positive(v, "--make-vocab-size-divisible-by") < 0)
        return GIVE_UP;
    tp = positive(v, "--tensor-model-parallel-size");
    pp = positive(v, "--pipeline-model-parallel-size");
    cp = positive(v, "--context-parallel-size");
    mbs = positive(v, "--micro-batch-size");
    if (tp < 0 || pp < 0 || cp < 0 || mbs < 0 || tp > MAX_LAYOUT || pp > MAX_LAYOUT || cp > MAX_LAYOUT ||
        mbs > MAX_LAYOUT || world > MAX_LAYOUT)
        return GIVE_UP;
    tp = tp ? tp : 1;
    pp = pp ? pp : 1;
    cp = cp ? cp : 1;
    mbs = mbs ? mbs : 1;
    world = world ? world : tp * pp * cp;
    if (world % (tp * pp * cp))
        return GIVE_UP;
    dp = world / (tp * pp * cp);
    /* plan_from_args */
    iters = positive(v, "--train-iters");
    samples = positive(v, "--train-samples");
    gbs = positive(v, "--global-batch-size");
    if (iters < 0 || samples < 0 || gbs < 0 || (iters && samples) || positive(v, "--save-interval") < 0)
        return GIVE_UP;
    gbs = gbs ? gbs : mbs * dp;
    if (flag(v, "--bf16")->set && flag(v, "--fp16")->set)
        return GIVE_UP;
    recompute = flag(v, "--recompute-granularity")->set ? flag(v, "--recompute-granularity")->s : NULL;
    if (recompute && strcmp(recompute, "full") != 0 && strcmp(recompute, "selective") != 0)
        return GIVE_UP;
    /* _vp_from_args */
    if (flag(v, "--num-layers-per-virtual-pipeline-stage")->set) {
        long long per = flag(v, "--num-layers-per-virtual-pipeline-stage")->n;
        if (flag(v, "--num-virtual-stages-per-pipeline-rank")->set || per < 1 || layers % pp || (layers / pp) % per)
            return GIVE_UP;
        vp = (layers / pp) / per;
    } else if (flag(v, "--num-virtual-stages-per-pipeline-rank")->set) {
        vp = flag(v, "--num-virtual-stages-per-pipeline-rank")->n;
        if (vp < 1 || vp > MAX_LAYOUT)
            return GIVE_UP;
    }
    /* node_shape */
    nodes = 1;
    gpn = world;
    if (gpus_per_node > 0 && world > gpus_per_node) {
        for (nodes = (world + gpus_per_node - 1) / gpus_per_node; nodes <= world; nodes++)
            if (world % nodes == 0 && world / nodes <= gpus_per_node)
                break;
        gpn = world / nodes;
    }
    /* require_length */
    if (!iters && !samples)
        return GIVE_UP;
    /* check_config */
    step = mbs * dp;
    m = gbs / step > 1 ? gbs / step : 1;
    if (vp < 1 || nodes * gpn != world || heads % tp || groups % tp)
        return GIVE_UP;
    if (tp > 1 && (gpn % tp || (gpus_per_node && tp > gpus_per_node)))
        return GIVE_UP;
    if (cp > 1 && seq % (2 * cp))
        return GIVE_UP;
    first = flag(v, "--decoder-first-pipeline-num-layers")->set ? flag(v, "--decoder-first-pipeline-num-layers")->n : -1;
    last = flag(v, "--decoder-last-pipeline-num-layers")->set ? flag(v, "--decoder-last-pipeline-num-layers")->n : -1;
    if (stage_layers(layers, pp, first, last, per_stage, &n_stages))
        return GIVE_UP;
    if (vp > 1) {
        if (pp < 2 || m < pp || m % pp)
            return GIVE_UP;
        for (k = 0; k < n_stages; k++)
            if (per_stage[k] % vp)
                return GIVE_UP;
    }
    if (gbs % step)
        return GIVE_UP;
    if (flag(v, "--rampup-batch-size")->set) {
        const long long *r = flag(v, "--rampup-batch-size")->n3;
        long long b;
        if (r[0] < 1 || r[1] < 1 || r[0] > gbs || (gbs - r[0]) % r[1] || (gbs - r[0]) / r[1] > MAX_RAMP_STEPS)
            return GIVE_UP;
        for (b = r[0]; b <= gbs; b += r[1])
            if (b % step)
                return GIVE_UP;
    }
    return 0;
}

/* ------------------------------------------------------------------ the profile token */

/* json.dumps of a list of ASCII strings (ensure_ascii: controls as escapes). */
static int json_list(const struct strs *words, struct str *out)
{
    size_t k, i;
    if (str_addc(out, '['))
        return GIVE_UP;
    for (k = 0; k < words->n; k++) {
        const char *w = words->v[k].p;
        if (!ascii(w, words->v[k].n) || (k && str_add(out, ", ", 2)) || str_addc(out, '"'))
            return GIVE_UP;
        for (i = 0; i < words->v[k].n; i++) {
            unsigned char c = (unsigned char)w[i];
            char esc[8];
            int rc;
            switch (c) {
            case '"': rc = str_add(out, "\\\"", 2); break;
            case '\\': rc = str_add(out, "\\\\", 2); break;
            case '\n': rc = str_add(out, "\\n", 2); break;
            case '\r': rc = str_add(out, "\\r", 2); break;
            case '\t': rc = str_add(out, "\\t", 2); break;
            case '\b': rc = str_add(out, "\\b", 2); break;
            case '\f': rc = str_add(out, "\\f", 2); break;
            default:
                if (c < 0x20 || c == 0x7f) {
                    snprintf(esc, sizeof esc, "\\u%04x", c);
                    rc = str_add(out, esc, 6);
                } else {
                    rc = str_addc(out, (char)c);
                }
            }
            if (rc)
                return GIVE_UP;
        }
        if (str_addc(out, '"'))
            return GIVE_UP;
    }
    return str_addc(out, ']');
}

/* base64.urlsafe_b64encode */
static int base64url(const struct str *in, struct str *out)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t i;
    for (i = 0; i < in->n; i += 3) {
        unsigned long b = (unsigned long)(unsigned char)in->p[i] << 16;
        char quad[4];
        if (i + 1 < in->n)
            b |= (unsigned long)(unsigned char)in->p[i + 1] << 8;
        if (i + 2 < in->n)
            b |= (unsigned char)in->p[i + 2];
        quad[0] = abc[b >> 18 & 63];
        quad[1] = abc[b >> 12 & 63];
        quad[2] = i + 1 < in->n ? abc[b >> 6 & 63] : '=';
        quad[3] = i + 2 < in->n ? abc[b & 63] : '=';
        if (str_add(out, quad, 4))
            return GIVE_UP;
    }
    return 0;
}

/* jobscript.megatron_words: the known Megatron flags and their values; paths as "-". */
static int megatron_words(const struct strs *words, struct strs *out)
{
    size_t i = 0, m;
    while (i < words->n) {
        const char *w = words->v[i].p, *eq = strchr(w, '=');
        int k = flag_index(w, eq ? (size_t)(eq - w) : words->v[i].n);
        int kind = k < 0 ? -1 : psb_megatron_flags[k].kind;
        size_t width = kind < 0 || kind == PSB_MEG_BOOL || eq ? 1 : kind == PSB_MEG_INT3 ? 4 : 2;
        if (kind == PSB_MEG_PATH) {
            if (eq ? strs_push(out, w, (size_t)(eq - w) + 1) || str_addc(&out->v[out->n - 1], '-')
                   : strs_push(out, w, words->v[i].n) || strs_push(out, "-", 1))
                return GIVE_UP;
        } else if (kind >= 0) {
            for (m = 0; m < width && i + m < words->n; m++)
                if (strs_push(out, words->v[i + m].p, words->v[i + m].n))
                    return GIVE_UP;
        }
        i += width;
    }
    return 0;
}

/* token.encode_profile */
static int profile_token(const struct strs *words, const struct own *o, struct str *out)
{
    struct strs kept = {NULL, 0, 0};
    struct str json = {NULL, 0, 0};
    char number[64];
    if (megatron_words(words, &kept) || json_list(&kept, &json) ||
        str_add(out, PSB_PROFILE_PREFIX ";args=", strlen(PSB_PROFILE_PREFIX) + 6) || base64url(&json, out))
        return GIVE_UP;
    if (o->has_gpus) {
        snprintf(number, sizeof number, ";gpus=%lld-%lld", o->gpus_lo, o->gpus_hi);
        if (str_add(out, number, strlen(number)))
            return GIVE_UP;
    }
    if (o->min_micro_batch) {
        snprintf(number, sizeof number, ";mbmin=%lld", o->min_micro_batch);
        if (str_add(out, number, strlen(number)))
            return GIVE_UP;
    }
    if (o->pp.n && (str_add(out, ";pp=", 4) || str_add(out, o->pp.p, o->pp.n)))
        return GIVE_UP;
    if (o->has_class && (str_add(out, ";class=", 7) || str_add(out, o->job_class.p ? o->job_class.p : "",
                                                                  o->job_class.n)))
        return GIVE_UP;
    return 0;
}

/* ------------------------------------------------------------------ the decision */

struct own_scan {
    unsigned char *own;  /* own[i]: argv word i (from 0) is part of a --pipeswift option */
    struct strs pairs;   /* their (key, value) pairs */
    int failed;
};

static void take_own(const struct psb_opt *o, void *ctx)
{
    struct own_scan *s = ctx;
    const char *key;
    size_t len;
    int i;
    if (o->what != PSB_OPT_OWN)
        return;
    for (i = o->start; i < o->end; i++)
        s->own[i] = 1;
    key = o->name + strlen(PSB_OWN_PREFIX) - 2;
    len = o->name_len - (strlen(PSB_OWN_PREFIX) - 2);
    while (len && *key == '-') {
        key++;
        len--;
    }
    if (strs_push(&s->pairs, key, len) || strs_push(&s->pairs, o->value ? o->value : "", o->value ? strlen(o->value) : 0))
        s->failed = 1;
}

static void take_nothing(const struct psb_opt *o, void *ctx)
{
    (void)o;
    (void)ctx;
}

/* The answer: sbatch gets `argv` (n words) unchanged, the script as it was. */
static int unchanged(char **argv, int n, struct answer *a)
{
    int k;
    memset(a, 0, sizeof *a);
    a->index = -1;
    if ((a->argv = malloc(((size_t)n + 2) * sizeof *a->argv)) == NULL)
        return GIVE_UP;
    a->argv[a->argc++] = "sbatch";
    for (k = 0; k < n; k++)
        a->argv[a->argc++] = argv[k];
    a->argv[a->argc] = NULL;
    return 0;
}

int psb_decide(int argc, char **argv, const char *text, size_t text_len, int may_write_file, struct answer *a)
{
    struct own_scan scan;
    struct header h;
    struct own own;
    struct values values;
    struct command cmd;
    struct strs all_pairs = {NULL, 0, 0};
    struct str comment = {NULL, 0, 0}, new_text = {NULL, 0, 0};
    char **kept, **out;
    size_t *ls, n_lines = 1, k;
    int n = argc - 1, n_kept = 0, components, found, script, i;
    long long world, per_node, gpus_per_node;

    if (text == NULL || n < 0 || memchr(text, '\0', text_len) || odd(text, text_len))
        return GIVE_UP;
    /* strip_own_options */
    memset(&scan, 0, sizeof scan);
    if ((scan.own = calloc((size_t)n + 1, 1)) == NULL || (kept = malloc(((size_t)n + 1) * sizeof *kept)) == NULL)
        return GIVE_UP;
    psb_scan_options(n, argv + 1, 1, take_own, &scan, NULL);
    if (scan.failed)
        return GIVE_UP;
    for (i = 0; i < n; i++)
        if (!scan.own[i])
            kept[n_kept++] = argv[i + 1];
    kept[n_kept] = NULL;
    /* plan_job */
    for (k = 0; k < text_len; k++)
        n_lines += text[k] == '\n';
    if ((ls = malloc((n_lines + 1) * sizeof *ls)) == NULL)
        return GIVE_UP;
    ls[0] = 0;
    for (k = 0, i = 1; k < text_len; k++)
        if (text[k] == '\n')
            ls[i++] = k + 1;
    ls[n_lines] = text_len + 1;
    memset(&h, 0, sizeof h);
    if (read_header(text, ls, n_lines, &h) || strs_extend(&all_pairs, &h.own) || strs_extend(&all_pairs, &scan.pairs) ||
        own_options(&all_pairs, &own))
        return GIVE_UP;
    if (own.off)
        return unchanged(kept, n_kept, a);
    if (effective_values(&h, kept, n_kept, &values, &components))
        return GIVE_UP;
    memset(&cmd, 0, sizeof cmd);
    if ((found = find_training_command(text, ls, n_lines, &cmd)) < 0)
        return GIVE_UP;
    if (components > 1 || h.het || (!found && own.declared) || h.version_dependent)
        return GIVE_UP; /* Python warns */
    if (!found)
        return unchanged(kept, n_kept, a);
    if (requested_world(&values, &world, &per_node))
        return GIVE_UP;
    gpus_per_node = per_node;
    if (gpus_per_node == 0) {
        const char *env = getenv("PIPESWIFT_GPUS_PER_NODE");
        if (env && (!ascii(env, strlen(env)) || odd(env, strlen(env)) || (gpus_per_node = count(env)) < 0))
            return GIVE_UP;
        gpus_per_node = gpus_per_node ? gpus_per_node : 8;
    }
    if (megatron_valid(&cmd.words, world, gpus_per_node))
        return GIVE_UP;
    /* the Comment: the user's, then the profile token */
    if (str_add(&comment, "--comment=", 10))
        return GIVE_UP;
    if (values.value[O_COMMENT] && *values.value[O_COMMENT] &&
        (str_add(&comment, values.value[O_COMMENT], strlen(values.value[O_COMMENT])) || str_addc(&comment, ' ')))
        return GIVE_UP;
    if (profile_token(&cmd.words, &own, &comment))
        return GIVE_UP;
    /* the script: the training command through the launcher, unless it already is */
    for (k = 0; k < cmd.words.n && k < 3; k++) {
        size_t len;
        const char *base = base_name(cmd.words.v[k].p, cmd.words.v[k].n, &len);
        if (equals(base, len, PSB_LAUNCHER))
            break;
    }
    if (str_add(&new_text, text, k < cmd.words.n && k < 3 ? text_len : cmd.at))
        return GIVE_UP;
    if (!(k < cmd.words.n && k < 3) &&
        (str_add(&new_text, PSB_LAUNCHER " -- ", strlen(PSB_LAUNCHER) + 4) ||
         str_add(&new_text, text + cmd.at, text_len - cmd.at)))
        return GIVE_UP;
    /* sbatch's argv: the new --comment (and --wrap) in front of the rest */
    if ((out = malloc(((size_t)n_kept + 4) * sizeof *out)) == NULL)
        return GIVE_UP;
    memset(a, 0, sizeof *a);
    a->argv = out;
    a->index = -1;
    out[a->argc++] = "sbatch";
    out[a->argc++] = comment.p;
    if (values.has_wrap) {
        struct str wrap = {NULL, 0, 0};
        if (str_add(&wrap, "--wrap=", 7) || str_add(&wrap, new_text.p, new_text.n))
            return GIVE_UP;
        out[a->argc++] = wrap.p;
    }
    for (i = 0; i < n_kept; i++)
        if (!values.drop[i])
            out[a->argc++] = kept[i];
    out[a->argc] = NULL;
    if (values.has_wrap)
        return 0;
    script = psb_scan_options(a->argc - 1, out + 1, 1, take_nothing, NULL, NULL);
    if (script < 0) {
        a->in = new_text.p;
        a->in_len = new_text.n;
        a->has_in = 1;
        return 0;
    }
    if (!may_write_file)
        return GIVE_UP;
    {
        size_t len;
        const char *base = base_name(out[script + 1], strlen(out[script + 1]), &len);
        a->name = len ? base : "script";
    }
    a->index = script;
    a->script = new_text.p;
    a->script_len = new_text.n;
    a->has_script = 1;
    return 0;
}
