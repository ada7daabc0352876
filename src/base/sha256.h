/* sha256.h — SHA-256 (FIPS 180-4), for recognizing known files (the chat template) by their digest. */
#ifndef LILY_BASE_SHA256_H
#define LILY_BASE_SHA256_H

#include <stddef.h>
#include <stdint.h>

/* digest = SHA-256(data[0..len)). Cannot fail. */
void lily_sha256(const void *data, size_t len, uint8_t digest[32]);

/* hex = the 64 lowercase hex digits of SHA-256(data[0..len)) plus a NUL. Cannot fail. */
void lily_sha256_hex(const void *data, size_t len, char hex[65]);

#endif
