// yaml-cpp's event parser feeding a flat, bounded tree (see manifest_yaml.hpp for why its
// own loaders are not used).
#include "manifest_yaml.hpp"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/parser.h>

#include <exception>
#include <sstream>

#include "kreg/text.hpp"

namespace kreg::manifest_yaml {

namespace {

const std::string kEmpty;

Mark from_yaml(const YAML::Mark& m) { return Mark{m.line, m.column, m.pos}; }

// Thrown from the event handler to stop the parse; yaml-cpp unwinds through it like
// through its own exceptions.
struct Stop {
  Mark mark;
  std::string message;
};

// The second document's start: seen, then the parse stops (its content is never read).
struct SecondDocument {
  Mark mark;
};

class SecondDocumentProbe : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { throw SecondDocument{from_yaml(mark)}; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

}  // namespace

// ---- Node ----

uint32_t Node::target() const {
  const Document::Data& d = doc_->nodes_[id_];
  return d.alias ? d.target : id_;
}

Node::Kind Node::kind() const {
  return doc_ == nullptr ? Kind::kNull : doc_->nodes_[target()].kind;
}

const std::string& Node::Tag() const {
  return doc_ == nullptr ? kEmpty : doc_->nodes_[target()].tag;
}

const std::string& Node::Scalar() const {
  return doc_ == nullptr ? kEmpty : doc_->nodes_[target()].scalar;
}

Mark Node::GetMark() const { return doc_ == nullptr ? Mark{} : doc_->nodes_[id_].mark; }

bool Node::IsFlow() const { return doc_ != nullptr && doc_->nodes_[target()].flow; }

bool Node::IsAlias() const { return doc_ != nullptr && doc_->nodes_[id_].alias; }

size_t Node::size() const {
  if (doc_ == nullptr) return 0;
  const Document::Data& d = doc_->nodes_[target()];
  if (d.kind == Kind::kSequence) return d.children.size();
  if (d.kind == Kind::kMap) return d.children.size() / 2;
  return 0;
}

Node Node::operator[](size_t i) const {
  if (!IsSequence() || i >= size()) return Node();
  return Node(doc_, doc_->nodes_[target()].children[i]);
}

Node Node::key(size_t i) const {
  if (!IsMap() || i >= size()) return Node();
  return Node(doc_, doc_->nodes_[target()].children[2 * i]);
}

Node Node::value(size_t i) const {
  if (!IsMap() || i >= size()) return Node();
  return Node(doc_, doc_->nodes_[target()].children[2 * i + 1]);
}

// ---- Builder ----

class Builder : public YAML::EventHandler {
 public:
  Builder(Document& doc, const Limits& limits, std::string_view text)
      : doc_(doc), limits_(limits), text_(text) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    add(mark, Node::Kind::kNull, "", anchor, false);
  }

  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    const uint32_t id = add(mark, Node::Kind::kScalar, tag, anchor, false);
    doc_.nodes_[id].scalar = value;
    check_quote_closed(mark);
  }

  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    if (anchor == 0 || anchor > anchors_.size()) {
      throw Stop{from_yaml(mark), "YAML syntax error: an alias to an unknown anchor"};
    }
    const uint32_t target = anchors_[anchor - 1];
    if (target == kOpen) {
      throw Stop{from_yaml(mark),
                 "an alias inside the node its anchor names (a recursive structure)"};
    }
    // An alias stands for a copy of its anchor's whole subtree: that is what a walk of the
    // tree visits, so that is what the expansion budget counts.
    const uint64_t size = expanded_[target];
    if (expanded_total_ + size > limits_.max_expanded_nodes) {
      throw Stop{from_yaml(mark),
                 "aliases expand the manifest to more than " +
                     std::to_string(limits_.max_expanded_nodes) +
                     " nodes (an anchor used over and over); write the values out"};
    }
    const uint32_t id = add(mark, Node::Kind::kNull, "", 0, false, size);
    Document::Data& d = doc_.nodes_[id];
    d.alias = true;
    d.target = target;
  }

  void OnSequenceStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value style) override {
    open(mark, Node::Kind::kSequence, tag, anchor, style == YAML::EmitterStyle::Flow);
  }
  void OnSequenceEnd() override { close(); }

  void OnMapStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value style) override {
    open(mark, Node::Kind::kMap, tag, anchor, style == YAML::EmitterStyle::Flow);
  }
  void OnMapEnd() override { close(); }

 private:
  static constexpr uint32_t kOpen = UINT32_MAX;

  uint32_t add(const YAML::Mark& mark, Node::Kind kind, const std::string& tag,
               YAML::anchor_t anchor, bool flow, uint64_t expanded = 1) {
    if (doc_.nodes_.size() >= limits_.max_nodes) {
      throw Stop{from_yaml(mark), "the manifest has more than " +
                                      std::to_string(limits_.max_nodes) +
                                      " YAML nodes; a manifest needs a few per group"};
    }
    expanded_total_ += expanded;
    if (expanded_total_ > limits_.max_expanded_nodes) {
      throw Stop{from_yaml(mark), "aliases expand the manifest to more than " +
                                      std::to_string(limits_.max_expanded_nodes) + " nodes"};
    }
    const auto id = static_cast<uint32_t>(doc_.nodes_.size());
    Document::Data d;
    d.kind = kind;
    d.flow = flow;
    d.mark = from_yaml(mark);
    d.tag = tag;
    doc_.nodes_.push_back(std::move(d));
    expanded_.push_back(expanded);
    if (stack_.empty()) {
      if (doc_.root_ == UINT32_MAX) doc_.root_ = id;
    } else {
      doc_.nodes_[stack_.back()].children.push_back(id);
    }
    if (anchor != 0) {
      if (anchors_.size() < anchor) anchors_.resize(anchor, kOpen);
      // A collection's anchor is usable once the collection is closed (close() sets it).
      anchors_[anchor - 1] = kind == Node::Kind::kSequence || kind == Node::Kind::kMap ? kOpen : id;
    }
    return id;
  }

  void open(const YAML::Mark& mark, Node::Kind kind, const std::string& tag, YAML::anchor_t anchor,
            bool flow) {
    if (static_cast<int>(stack_.size()) >= limits_.max_depth) {
      throw Stop{from_yaml(mark), "collections nested more than " +
                                      std::to_string(limits_.max_depth) +
                                      " levels deep; a manifest needs four"};
    }
    const uint32_t id = add(mark, kind, tag, anchor, flow);
    stack_.push_back(id);
    open_anchor_.push_back(anchor);
  }

  void close() {
    if (stack_.empty()) return;
    const uint32_t id = stack_.back();
    const YAML::anchor_t anchor = open_anchor_.back();
    stack_.pop_back();
    open_anchor_.pop_back();
    uint64_t size = 1;
    for (uint32_t child : doc_.nodes_[id].children) size += expanded_[child];
    expanded_[id] = size;
    if (anchor != 0) anchors_[anchor - 1] = id;
  }

  // yaml-cpp ends a quoted scalar that is never closed at the end of the text and takes
  // everything up to there as its value; a missing quote must be an error instead.
  void check_quote_closed(const YAML::Mark& mark) const {
    if (mark.pos < 0) return;
    size_t i = static_cast<size_t>(mark.pos);
    // Past the node's properties (`!tag`, `&anchor`) to the scalar itself.
    while (i < text_.size() && (text_[i] == '!' || text_[i] == '&')) {
      while (i < text_.size() && text_[i] != ' ' && text_[i] != '\t' && text_[i] != '\n' &&
             text_[i] != '\r') {
        ++i;
      }
      while (i < text_.size() &&
             (text_[i] == ' ' || text_[i] == '\t' || text_[i] == '\n' || text_[i] == '\r')) {
        ++i;
      }
    }
    if (i >= text_.size() || (text_[i] != '"' && text_[i] != '\'')) return;
    if (quoted_end(text_, i) == std::string_view::npos) {
      throw Stop{from_yaml(mark), std::string("YAML syntax error: the ") +
                                      (text_[i] == '"' ? "double" : "single") +
                                      "-quoted string that starts here is never closed"};
    }
  }

  Document& doc_;
  const Limits& limits_;
  std::string_view text_;
  std::vector<uint32_t> stack_;  // open collections
  std::vector<YAML::anchor_t> open_anchor_;
  std::vector<uint32_t> anchors_;   // anchor_t - 1 -> node id, kOpen while its node is open
  std::vector<uint64_t> expanded_;  // per node: its subtree's size with aliases expanded
  uint64_t expanded_total_ = 0;
};

// ---- load ----

Loaded load(std::string_view text, const Limits& limits) {
  Loaded out;
  if (!prescan(text, out.errors)) return out;
  std::istringstream stream{std::string(text)};
  try {
    YAML::Parser parser(stream);
    Builder builder(out.document, limits, text);
    // Exactly one document is built and at most the start of a second is looked at:
    // never a loop over documents, which is where yaml-cpp can spin forever.
    if (!parser.HandleNextDocument(builder)) return out;
    out.empty = false;
    try {
      SecondDocumentProbe probe;
      parser.HandleNextDocument(probe);
    } catch (const SecondDocument& second) {
      const size_t pos = second.mark.pos >= 0 ? static_cast<size_t>(second.mark.pos) : 0;
      if (pos < text.size() && text[pos] == ',') {
        // A ',' outside any flow collection is no token of any node: yaml-cpp leaves it
        // unconsumed and reports one empty document after another.
        out.errors.push_back({second.mark,
                              "YAML syntax error: ',' outside a flow collection ([...] or "
                              "{...}); quote the value if the comma belongs to it"});
      } else {
        out.second_document = true;
        out.second_document_mark = second.mark;
      }
    }
  } catch (const Stop& stop) {
    out.errors.push_back({stop.mark, stop.message});
  } catch (const YAML::DeepRecursion& e) {
    out.errors.push_back(
        {from_yaml(e.mark), "YAML nested more than " + std::to_string(e.depth()) + " levels deep"});
  } catch (const YAML::ParserException& e) {
    out.errors.push_back({from_yaml(e.mark), "YAML syntax error: " + excerpt(e.msg, 200)});
  } catch (const std::exception& e) {
    // Nothing else is expected from yaml-cpp, but a manifest must never take a host down.
    out.errors.push_back({Mark{}, "cannot parse the YAML: " + excerpt(e.what(), 200)});
  }
  return out;
}

}  // namespace kreg::manifest_yaml
