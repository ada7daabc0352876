/* base.h — always-on assertions and small helpers every source file may use.
 *
 * LILY_ASSERT is for programmer mistakes (a shape the code itself computed wrong), never for bad input:
 * bad input returns a lily_status with a message.
 */
#ifndef LILY_BASE_H
#define LILY_BASE_H

#include <stdio.h>
#include <stdlib.h>

#define LILY_ASSERT(cond)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "lily: assertion failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define LILY_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LILY_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
