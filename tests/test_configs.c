/* The configs/ files, each run through the checks gptc-train makes of a config itself
 * before it allocates anything (the keys, the layout for the world they name, the model
 * shape, the batch and pipeline plans, what the device can run; not those of the files it
 * names, data, train.init and outputs, which are the user's), so that a shipped config for
 * 8 GPUs is known to start without 8 GPUs here. A file's name says its layout (tp2, pp2, dp8; a
 * parallelism it does not name is 1), and the test holds the file to it.
 *   test_configs configs/[name].ini ... */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/config.h"
#include "engine/run_plan.h"
#include "layers/gpt.h"
#include "parallel/grid.h"
#include "tests/check.h"

/* The size the file's name gives a parallelism ("tp2" in "tiny-tp2-pp2-dp2.ini"), or 1. */
static int named_size(const char *path, const char *which) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (const char *p = strstr(base, which); p; p = strstr(p + 1, which))
        if ((p == base || p[-1] == '-') && isdigit((unsigned char)p[2])) return atoi(p + 2);
    return 1;
}

/* 0 when path passes every check for the world its layout names, with the plan in line;
 * -1 with err naming the file and what fails. */
static int plan_config(const char *path, char *line, size_t ln, char *err, size_t n) {
    gptc_config c;
    char why[400] = "";
    gpt_shape s;
    batch_plan bp;
    grid g;
    config_defaults(&c);
    if (config_load(&c, path, 0, NULL, why, sizeof why) != 0 ||
        config_validate(&c, why, sizeof why) != 0)
        goto fail;
    int dp = c.dp ? c.dp : 1, world = c.tp * c.pp * dp;
    const char *names[] = {"tp", "pp", "dp"};
    int sizes[] = {c.tp, c.pp, dp};
    for (int i = 0; i < 3; i++)
        if (named_size(path, names[i]) != sizes[i]) {
            snprintf(why, sizeof why, "parallel.%s = %d, but the name says %d", names[i],
                     sizes[i], named_size(path, names[i]));
            goto fail;
        }
    /* every rank's plan is rank 0's: the checks depend on the layout's sizes alone */
    if (grid_layout(&g, world, 0, c.tp, c.pp, c.dp, why, sizeof why) != 0 ||
        plan_check_supported(&c, &g, why, sizeof why) != 0 ||
        plan_layout(&c, &g, NULL, &s, &bp, why, sizeof why) != 0 ||
        plan_check_device(&c, &s, bp.T, why, sizeof why) != 0)
        goto fail;
    snprintf(line, ln, "%s, %d rank(s) (tp %d, pp %d, dp %d), %d layers, d_model %d, %d rows of "
             "%d tokens in %d micro-batch(es) of %d a rank", c.device, world, g.tp, g.pp, g.dp,
             s.n_layer, s.d_model, bp.B, bp.T, bp.n_micro, bp.mb);
    return 0;
fail:
    snprintf(err, n, "%s: %s", path, why);
    return -1;
}

/* A config file with text, under name in a directory of its own (made at the first
 * call); its path in path. */
static void write_config(char *path, size_t n, const char *name, const char *text) {
    static char dir[] = "/tmp/gptc_test_configs_XXXXXX";
    /* a flag, not the template's last letter: mkdtemp's own name ends in X one time in 62 */
    static int made;
    if (!made && !mkdtemp(dir)) {
        perror("mkdtemp");
        exit(2);
    }
    made = 1;
    snprintf(path, n, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_configs CONFIG.ini ...\n");
        return 2;
    }
    char line[256], err[512], path[256];
    for (int i = 1; i < argc; i++) {
        int rc = plan_config(argv[i], line, sizeof line, err, sizeof err);
        check(rc == 0, "%s", err);
        if (rc == 0) printf("%s: %s: ok\n", argv[i], line);
    }
    /* the test of the test: a file its name contradicts, and a layout that does not
     * divide its model, fail (each file in a directory of its own, removed after) */
    const char *model = "[model]\nn_layer = 6\nn_head = 6\nd_model = 192\nn_ctx = 128\n"
                        "vocab_size = 256\n[train]\nglobal_batch = 16\n[data]\npath = t.h5\n";
    const struct { const char *name, *layout, *refusal, *what; } bad[] = {
        {"m-tp4.ini", "[parallel]\ntp = 2\n", "parallel.tp = 2, but the name says 4",
         "a tp 2 file named tp4"},
        {"m-dp2.ini", "[parallel]\ntp = 2\n", "parallel.tp = 2, but the name says 1",
         "a tp 2 file whose name does not say tp"},
        {"m-pp4.ini", "[parallel]\npp = 4\n", "model.n_layer = 6 is not divisible",
         "6 layers over pp 4"},
        {"m-tp4.ini", "[parallel]\ntp = 4\n[train]\ndevice = cuda\n", "n_head",
         "6 heads over tp 4"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "%s%s", model, bad[i].layout);
        write_config(path, sizeof path, bad[i].name, text);
        check(plan_config(path, line, sizeof line, err, sizeof err) != 0 &&
                  strstr(err, bad[i].refusal),
              "%s is refused: '%s' (%s)", bad[i].what, bad[i].refusal, err);
        remove(path);
    }
    *strrchr(path, '/') = '\0';
    rmdir(path);
    check(named_size("configs/x-tp2-dp8.ini", "dp") == 8 && named_size("x-tp2.ini", "pp") == 1 &&
              named_size("configs/stp3.ini", "tp") == 1,
          "named_size reads the layout out of a file's name");
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    return failures != 0;
}
