/* webui.c — the embedded chat page (webui.h). The bytes come from the file CMake generates from
 * src/server/webui/index.html (lily_webui_html, lily_webui_html_len). */
#include "server/webui.h"

extern const unsigned char lily_webui_html[];
extern const size_t lily_webui_html_len;

const char *lily_webui_page(size_t *len)
{
    *len = lily_webui_html_len;
    return (const char *)lily_webui_html;
}
