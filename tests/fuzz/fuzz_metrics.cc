// libFuzzer target: arbitrary bytes as a run's metrics.jsonl, the file `miles report` reads from
// any run directory it is pointed at: parsed into columns (parse_metrics_jsonl), then the report's
// summary table and every chart drawn from them, whatever the values (huge, negative, NaN holes,
// steps out of order). Bad input must come back as an error value or a page: no crash, no UB
// (a float that does not fit the integer it is converted to), no leak.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "report/metrics_table.h"
#include "report/report_sections.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto table = miles::report::parse_metrics_jsonl(text, "metrics.jsonl");
  if (!table.ok()) {
    if (table.message().rfind("metrics.jsonl", 0) != 0) {
      std::fprintf(stderr, "an error that does not name the file: %s\n", table.message().c_str());
      std::abort();
    }
    return 0;
  }
  for (const auto& [key, column] : table->columns)
    if (column.size() != table->rows()) std::abort();  // every column has a value or hole per row
  (void)miles::report::summary_table(*table);
  int drawn = 0, skipped = 0;
  (void)miles::report::chart_sections(*table, drawn, skipped);
  return 0;
}
