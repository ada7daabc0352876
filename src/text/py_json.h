/* py_json.h — JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it.
 *
 * Hugging Face chat templates format tools and tool-call arguments with the `tojson` filter, which
 * transformers defines as json.dumps(x, ensure_ascii=False): ", " and ": " separators, keys in insertion
 * order (not sorted), non-ASCII written raw, control characters as \uXXXX (lowercase hex) except
 * \b \f \n \r \t, floats as Python's repr (shortest round-trip digits: 1.0, 1e-05, 1e+16).
 */
#ifndef LILY_TEXT_PY_JSON_H
#define LILY_TEXT_PY_JSON_H

#include <jansson.h>

/* A malloc'd NUL-terminated string: json.dumps(value, ensure_ascii=False). NULL when out of memory.
 * Integers are jansson's json_int_t (64-bit); reals are doubles. */
char *lily_py_json_dumps(const json_t *value);

/* Python's repr(float(x)) into buf (at least 32 bytes): "0.1", "1.0", "1e-05", "1.5e+300", "-0.0",
 * "Infinity", "NaN" (json.dumps spelling for the non-finite values). */
void lily_py_float_repr(double x, char *buf, size_t size);

#endif
