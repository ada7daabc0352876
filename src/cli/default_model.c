/* default_model.c — which model directory a command uses when -m is not given (cli_common.h). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "cli_common.h"

#ifndef LILY_SOURCE_DIR
#define LILY_SOURCE_DIR "."
#endif

static bool is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

const char *cli_default_model(const char *cmd, bool *is_test_model)
{
    *is_test_model = false;
    static char path[4096];
    const char *env = getenv("LILY_MODEL");
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
        fprintf(stderr, "lily %s: no -m given; using $LILY_MODEL = %s\n", cmd, path);
        return path;
    }
    snprintf(path, sizeof path, "%s/models/%s", LILY_SOURCE_DIR, LILY_DEFAULT_MODEL_NAME);
    if (is_dir(path)) {
        fprintf(stderr, "lily %s: no -m given; using the bundled default model %s\n", cmd, path);
        return path;
    }
    snprintf(path, sizeof path, "%s/tests/data/tiny-chat", LILY_SOURCE_DIR);
    if (!is_dir(path)) {
        fprintf(stderr, "lily %s: no -m given, $LILY_MODEL is not set, and neither the bundled model "
                        "(models/%s) nor the test model (tests/data/tiny-chat) is under %s: pass -m DIR\n",
                cmd, LILY_DEFAULT_MODEL_NAME, LILY_SOURCE_DIR);
        return path;
    }
    *is_test_model = true;
    fprintf(stderr, "lily %s: no -m given and no bundled model; using the test model %s (random weights: "
                    "its output is noise; replies stop at 128 tokens unless -n is given)\n", cmd, path);
    return path;
}
