#include "common/text_table.h"

#include "gtest/gtest.h"

namespace headroom {
namespace {

TEST(TextTable, AlignsColumnsAndDrawsRules) {
  TextTable table({"name", "bytes"}, {Align::kLeft, Align::kRight});
  table.AddRow({"weights", "16.00 GiB"});
  table.AddSeparator();
  table.AddRow({"total", "1 B"});
  EXPECT_EQ(table.Render(),
            "name         bytes\n"
            "------------------\n"
            "weights  16.00 GiB\n"
            "------------------\n"
            "total          1 B\n");
}

TEST(TextTable, PadsShortRows) {
  TextTable table({"a", "b", "c"});
  table.AddRow({"x"});
  EXPECT_EQ(table.Render(), "a  b  c\n-------\nx\n");
}

}  // namespace
}  // namespace headroom
