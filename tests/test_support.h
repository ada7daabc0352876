/* test_support.h — helpers shared by the cmocka tests: data paths and float comparisons. */
#ifndef LILY_TEST_SUPPORT_H
#define LILY_TEST_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* "<tests/data>/<relative>" in a static buffer (valid until the next call). */
const char *test_data_path(const char *relative);

/* Read a whole file into a malloc'd NUL-terminated buffer; NULL on failure. *len may be NULL. */
char *test_read_file(const char *path, size_t *len);

/* max |a - b| over n floats. */
float test_max_abs_diff(const float *a, const float *b, size_t n);

#endif
