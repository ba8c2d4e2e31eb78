/*
 * The parts of psbatch's compiled front end that read a submission: sbatch's argv, split
 * as sbatch splits it, and the decision for a Megatron job made in C (decide.c).
 */
#ifndef PSBATCH_DECIDE_H
#define PSBATCH_DECIDE_H

#include <stddef.h>

/* What to do, as psbatch.Action says it: sbatch's argv, a warning, stdin bytes, and the
 * rewritten script to write to a file (its argv index and name). The resident helper
 * sends one; decide.c makes one for the jobs it decides. */
struct answer {
    char **argv;        /* argv[0] "sbatch", then the words; NULL-terminated */
    int argc;
    const char *warning, *in, *name, *script;
    size_t warning_len, in_len, script_len;
    int has_in, has_script;
    long index;         /* argv index (without argv[0]) of the script to write */
};

/* One option of an sbatch argv, as sbatch_args.scan_argv finds it. */
enum { PSB_OPT_KNOWN, PSB_OPT_OWN, PSB_OPT_UNKNOWN };
struct psb_opt {
    int what;           /* PSB_OPT_*: sbatch's (canonical name), psbatch's own, or unknown */
    const char *name;   /* not NUL-terminated for own and unknown long options; NULL: unknown short */
    size_t name_len;
    const char *value;  /* NULL: none */
    int start, end;     /* the words it spans: [start, end) */
};
typedef void (*psb_opt_fn)(const struct psb_opt *opt, void *ctx);

/* sbatch_args.scan_argv over words[0..n): calls `fn` for each option in order and returns
 * the index of the script (-1: none); `components` (may be NULL) gets the het components. */
int psb_scan_options(int n, char *const *words, int stop_at_script, psb_opt_fn fn, void *ctx, int *components);

/* What the Python psbatch would do with this submission (argv[0] is psbatch; `text` is the
 * script as read_source reads it, NULL when it read none), when that can be decided here
 * without doubt: 0 with `a` filled. -1 otherwise: ask the helper or the Python psbatch.
 * `may_write_file`: whether a rewritten script file can be handed to sbatch. */
int psb_decide(int argc, char **argv, const char *text, size_t text_len, int may_write_file, struct answer *a);

#endif
