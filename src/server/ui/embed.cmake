# embed.cmake — turns the chat page (src/server/ui/chat.html) into a C header holding its
# bytes, so the qwenrt binary serves GET / with no file at run time and no tool beyond CMake.
#   cmake -DIN=chat.html -DOUT=chat_page.h -P embed.cmake
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}.tmp" "/* generated from src/server/ui/chat.html by src/server/ui/embed.cmake; do not edit */\n"
     "static const unsigned char chat_page_html[] = {\n${bytes}\n};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
