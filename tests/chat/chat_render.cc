// chat_render SPEC.json: renders chat templates for
// tests/fixtures/check_chat_templates.py, which compares the output with
// Python's jinja2 on the templates models publish. SPEC is a list of
// {"name", "source", "bos", "eos", "cases": [{"messages", "tools", "agp",
// "kwargs"}]}; stdout is a list of {"name", "results": [text or {"error"}]}
// or {"name", "create_error"}.
#include <fstream>
#include <iostream>
#include <string>

#include "common/chat/chat_template.h"
#include "nlohmann/json.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: chat_render SPEC.json\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  const nlohmann::ordered_json spec = nlohmann::ordered_json::parse(in);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& t : spec) {
    nlohmann::ordered_json entry = {{"name", t["name"]}};
    auto tpl = tandem::ChatTemplate::Create(t["source"], t["name"], t["bos"], t["eos"]);
    if (!tpl.ok()) {
      entry["create_error"] = tpl.status().ToString();
      out.push_back(std::move(entry));
      continue;
    }
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (const auto& c : t["cases"]) {
      auto text = tpl->Render(c["messages"], c["tools"], c["agp"].get<bool>(), c["kwargs"]);
      if (text.ok()) {
        results.push_back(*text);
      } else {
        results.push_back({{"error", text.status().ToString()}});
      }
    }
    entry["results"] = std::move(results);
    out.push_back(std::move(entry));
  }
  std::cout << out.dump() << "\n";
  return 0;
}
