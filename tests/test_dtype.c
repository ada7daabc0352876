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
        cmocka_unit_test(test_dtype_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
