/* test_dtype.c — exact bf16/f16 widening and round-to-nearest-even bf16 narrowing. */
#include "test_support.h"

#include <math.h>

#include "base/dtype.h"

static void test_bf16_roundtrip_and_rounding(void **state)
{
    (void)state;
    assert_true(lily_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(lily_bf16_to_f32(0xc000) == -2.0f);
    assert_int_equal(lily_f32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0 */
    assert_int_equal(lily_f32_to_bf16(1.00390625f), 0x3f80);
    /* 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even) -> 1.015625 */
    assert_int_equal(lily_f32_to_bf16(1.01171875f), 0x3f82);
}

static void test_f16_widening(void **state)
{
    (void)state;
    assert_true(lily_f16_to_f32(0x3c00) == 1.0f);
    assert_true(lily_f16_to_f32(0xc400) == -4.0f);
    assert_true(lily_f16_to_f32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    assert_true(isinf(lily_f16_to_f32(0x7c00)));
    assert_true(isnan(lily_f16_to_f32(0x7e00)));
}

/* float -> half: round to nearest even at every scale, overflow, subnormals, NaN; and the exact
 * round trip of every finite half. */
static void test_f16_narrowing(void **state)
{
    (void)state;
    assert_int_equal(lily_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(lily_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(lily_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);      /* tie -> even */
    assert_int_equal(lily_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  /* tie -> even (up) */
    assert_int_equal(lily_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    assert_int_equal(lily_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(lily_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(lily_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(lily_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(lily_f32_to_f16(0x1p-25f), 0x0000);               /* tie -> even (0) */
    assert_int_equal(lily_f32_to_f16(3 * 0x1p-25f), 0x0002);           /* tie -> even (2) */
    assert_int_equal(lily_f32_to_f16(0x1p-14f - 0x1p-30f), 0x0400);    /* rounds up to the smallest normal */
    assert_int_equal(lily_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(lily_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(lily_f32_to_f16(NAN) & 0x7e00, 0x7e00);
    for (uint32_t h = 0; h < 0x10000u; h++)
        if ((h & 0x7c00u) != 0x7c00u)
            assert_int_equal(lily_f32_to_f16(lily_f16_to_f32((uint16_t)h)), h);
}

static void test_dtype_names(void **state)
{
    (void)state;
    assert_int_equal(lily_dtype_from_name("BF16"), LILY_DTYPE_BF16);
    assert_int_equal(lily_dtype_from_name("U32"), LILY_DTYPE_U32);
    assert_int_equal(lily_dtype_from_name("Q4"), LILY_DTYPE_UNKNOWN);
    assert_string_equal(lily_dtype_name(LILY_DTYPE_F16), "F16");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_roundtrip_and_rounding),
        cmocka_unit_test(test_f16_widening),
        cmocka_unit_test(test_f16_narrowing),
        cmocka_unit_test(test_dtype_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
