# embed_file.cmake — writes a C file defining `const unsigned char NAME[]` (the bytes of IN) and
# `const size_t NAME_len`. Run as: cmake -DIN=file -DOUT=file.c -DNAME=symbol -P tools/embed_file.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n_bytes "${n_hex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUT}" "/* generated from ${IN} by tools/embed_file.cmake; do not edit */\n#include <stddef.h>\n"
     "const unsigned char ${NAME}[] = {\n${bytes}\n};\nconst size_t ${NAME}_len = ${n_bytes};\n")
