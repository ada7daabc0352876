/* reply_printer.c — prints a reply as it streams (cli_common.h): raw text verbatim, or split by the
 * output parser into reasoning (ANSI faint on a terminal; between "<think>" and "</think>" lines when the
 * output is a pipe or a file; or hidden), content, and tool calls written as "[tool call] NAME {arguments}". */
#include <string.h>
#include <unistd.h>

#include "cli_common.h"

enum { PRINTED_NOTHING, PRINTED_REASONING, PRINTED_CONTENT, PRINTED_TOOL_CALL };

#define ANSI_FAINT "\033[2m"
#define ANSI_RESET "\033[0m"

static void put(cli_printer *p, const char *text, size_t len)
{
    if (len == 0)
        return;
    fwrite(text, 1, len, p->out);
    p->at_line_start = text[len - 1] == '\n';
}

static void end_reasoning(cli_printer *p)
{
    if (p->state != PRINTED_REASONING)
        return;
    if (p->tty) {
        fputs(ANSI_RESET, p->out);
        return;
    }
    if (!p->at_line_start)
        put(p, "\n", 1);
    put(p, "</think>\n", 9);
}

static void on_event(void *user, const lily_output_event *ev)
{
    cli_printer *p = user;
    switch (ev->kind) {
    case LILY_OUTPUT_REASONING:
        if (p->hide_reasoning || ev->len == 0)
            return;
        if (p->state != PRINTED_REASONING) {
            if (!p->at_line_start)
                put(p, "\n", 1);
            if (p->tty)
                fputs(ANSI_FAINT, p->out);
            else
                put(p, "<think>\n", 8);
            p->state = PRINTED_REASONING;
        }
        put(p, ev->text, ev->len);
        break;
    case LILY_OUTPUT_CONTENT:
        if (ev->len == 0)
            return;
        if (p->state == PRINTED_REASONING) {
            bool was_at_line_start = p->at_line_start;
            end_reasoning(p);
            put(p, was_at_line_start || !p->tty ? "\n" : "\n\n", was_at_line_start || !p->tty ? 1 : 2);
        }
        p->state = PRINTED_CONTENT;
        put(p, ev->text, ev->len);
        break;
    case LILY_OUTPUT_TOOL_CALL_START:
        end_reasoning(p);
        if (!p->at_line_start)
            put(p, "\n", 1);
        p->state = PRINTED_TOOL_CALL;
        put(p, "[tool call] ", 12);
        put(p, ev->text, ev->len);
        put(p, " ", 1);
        break;
    case LILY_OUTPUT_TOOL_ARGUMENTS:
        put(p, ev->text, ev->len);
        break;
    case LILY_OUTPUT_TOOL_CALL_END:
        put(p, "\n", 1);
        break;
    }
    fflush(p->out);
}

int cli_printer_init(cli_printer *p, FILE *out, bool raw, bool thinking, bool hide_reasoning)
{
    memset(p, 0, sizeof *p);
    p->out = out;
    p->raw = raw;
    p->hide_reasoning = hide_reasoning;
    p->tty = isatty(fileno(out));
    p->at_line_start = true;
    if (raw)
        return 0;
    lily_output_parser_options po = {.thinking = thinking, .tools = NULL, .on_event = on_event, .user = p};
    lily_error err = {0};
    if (lily_output_parser_new(&po, &p->parser, &err) != LILY_OK) {
        fprintf(stderr, "lily: %s\n", err.message);
        return 1;
    }
    return 0;
}

int cli_printer_on_token(void *user, int32_t token, const char *text, size_t len)
{
    (void)token;
    cli_printer *p = user;
    if (p->raw) {
        put(p, text, len);
        fflush(p->out);
        return 0;
    }
    lily_error err = {0};
    if (lily_output_parser_feed(p->parser, text, len, &err) != LILY_OK) {
        fprintf(stderr, "\nlily: %s\n", err.message);
        return 1;
    }
    return 0;
}

int cli_printer_finish(cli_printer *p, bool cut_by_length)
{
    int rc = 0;
    if (p->parser) {
        lily_error err = {0};
        if (lily_output_parser_finish(p->parser, cut_by_length, &err) != LILY_OK) {
            fprintf(stderr, "\nlily: %s\n", err.message);
            rc = 1;
        }
    }
    end_reasoning(p);
    p->state = PRINTED_NOTHING;
    if (!p->at_line_start)
        put(p, "\n", 1);
    fflush(p->out);
    return rc;
}

void cli_printer_free(cli_printer *p)
{
    lily_output_parser_free(p->parser);
    p->parser = NULL;
}
