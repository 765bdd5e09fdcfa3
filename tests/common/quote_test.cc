#include "common/quote.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace headroom {
namespace {

TEST(QuoteForError, KeepsOrdinaryText) {
  EXPECT_EQ(QuoteForError("llama"), "'llama'");
  EXPECT_EQ(QuoteForError(""), "''");
  EXPECT_EQ(QuoteForError("Ünïcödé 名前"), "'Ünïcödé 名前'");
  EXPECT_EQ(EscapeForError("max_position_embeddings"), "max_position_embeddings");
}

// A name from a file must not break the error's one line, nor drive the terminal.
TEST(QuoteForError, EscapesControlsAndBadBytes) {
  EXPECT_EQ(QuoteForError("a\nb\r\tc"), R"('a\nb\r\tc')");
  EXPECT_EQ(QuoteForError("\x1b[2Jgone"), R"('\x1b[2Jgone')");
  EXPECT_EQ(QuoteForError(std::string("nul\0x", 5)), R"('nul\x00x')");
  EXPECT_EQ(QuoteForError("it's a \\"), R"('it\'s a \\')");
  EXPECT_EQ(QuoteForError("\xc2\x9b" "31m"), R"('\u009b31m')");  // C1 CSI
  EXPECT_EQ(QuoteForError("bad \xff\xc3"), R"('bad \xff\xc3')");
  EXPECT_EQ(QuoteForError("\xe0\x80\x80"), R"('\xe0\x80\x80')");  // overlong
  EXPECT_EQ(EscapeForError("key\n"), R"(key\n)");
  EXPECT_EQ(EscapeForError("it's"), "it's");
}

TEST(QuoteForError, CutsLongText) {
  const std::string line(10 << 20, 'x');
  const std::string quoted = QuoteForError(line);
  EXPECT_EQ(quoted, "'" + std::string(kMaxEchoedChars, 'x') + "...' (10485760 bytes)");
  EXPECT_EQ(QuoteForError(std::string(kMaxEchoedChars, 'y')), "'" + std::string(kMaxEchoedChars, 'y') + "'");
  // Characters, not bytes, are counted: a cut never splits one.
  EXPECT_EQ(QuoteForError(std::string(79, 'a') + "\xc3\xa9" + "b"),
            "'" + std::string(79, 'a') + "\xc3\xa9...' (82 bytes)");
  EXPECT_EQ(EscapeForError(std::string(100, 'k')), std::string(kMaxEchoedChars, 'k') + "... (100 bytes)");
}

}  // namespace
}  // namespace headroom
