// Aligned plain-text tables for terminal reports.
//
//   TextTable table({"GPU", "Memory"}, {Align::kLeft, Align::kRight});
//   table.AddRow({"H100-SXM-80GB", "80.00 GiB"});
//   std::cout << table.Render();
//
// Columns are as wide as their widest cell and separated by two spaces; a
// rule of dashes follows the header. AddSeparator() draws a rule between rows.
#ifndef HEADROOM_COMMON_TEXT_TABLE_H_
#define HEADROOM_COMMON_TEXT_TABLE_H_

#include <string>
#include <vector>

namespace headroom {

enum class Align { kLeft, kRight };

class TextTable {
 public:
  // `align` may be shorter than `header`; missing columns align left.
  explicit TextTable(std::vector<std::string> header, std::vector<Align> align = {});

  // Rows shorter than the header are padded with empty cells; longer rows are a
  // programming error and are truncated.
  void AddRow(std::vector<std::string> cells);
  void AddSeparator();
  std::string Render() const;

 private:
  std::vector<std::string> header_;
  std::vector<Align> align_;
  std::vector<std::vector<std::string>> rows_;  // an empty row is a separator
};

}  // namespace headroom

#endif  // HEADROOM_COMMON_TEXT_TABLE_H_
