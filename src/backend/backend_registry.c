/* backend_registry.c — the one table of backends (DESIGN.md §3). */
#include "backend.h"

#include <string.h>

const lily_backend_ops *lily_backend_find(const char *name)
{
    if (strcmp(name, "cpu") == 0)
        return &lily_cpu_backend_ops;
    if (strcmp(name, "cuda") == 0)
        return lily_cuda_backend_ops_get();
    return NULL;
}

lily_status lily_backend_create(const char *name, const lily_config *cfg, const lily_weights *w,
                                const lily_backend_options *opts, lily_backend *b, lily_error *err)
{
    memset(b, 0, sizeof *b);
    const lily_backend_ops *ops = lily_backend_find(name);
    if (!ops)
        return lily_error_set(err, LILY_ERR_UNSUPPORTED,
                              "backend '%s' is not available in this build (available: cpu%s)", name,
                              lily_cuda_backend_ops_get() ? ", cuda" : "");
    lily_status st = ops->create(cfg, w, opts, &b->ctx, err);
    if (st != LILY_OK)
        return st;
    b->ops = ops;
    b->cfg = cfg;
    return LILY_OK;
}

void lily_backend_destroy(lily_backend *b)
{
    if (b && b->ops && b->ctx)
        b->ops->destroy(b->ctx);
    if (b)
        b->ctx = NULL;
}
