/* webui.h — the chat page `lily serve` answers at GET / (src/server/webui/index.html, embedded in the
 * binary at build time by tools/embed_file.cmake): a single static HTML file with its script inline that
 * talks to /v1/chat/completions (streaming, reasoning folded, tool calls shown, a stop button, the
 * conversation kept in the page). */
#ifndef LILY_SERVER_WEBUI_H
#define LILY_SERVER_WEBUI_H

#include <stddef.h>

/* The page's bytes (static, not NUL-terminated) and their count in *len. */
const char *lily_webui_page(size_t *len);

#endif
