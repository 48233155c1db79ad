// The manifest's YAML, read into a small bounded tree. yaml-cpp's own loaders are not used:
// YAML::LoadAll loops and allocates forever on input such as a lone ',' (a token no node
// consumes yields an endless run of empty documents, yaml-cpp#1040, in 0.7 and 0.8), and
// YAML::Load builds however many nodes the text describes. Here yaml-cpp only produces
// events, and the tree they build is held to limits that a manifest never comes near: one
// document, a node count, a nesting depth and an alias expansion budget. A text prescan
// (manifest_prescan.cpp) runs first so the parser never sees bytes it mishandles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kreg::manifest_yaml {

// Where a node starts: 0-based line and column (bytes), byte offset into the text.
struct Mark {
  int line = -1;
  int column = -1;
  int pos = -1;
};

// A problem that stops the manifest from being read at all.
struct LoadError {
  Mark mark;
  std::string message;
};

// Chosen far above any real manifest (registry.yaml has under a hundred nodes, three
// levels) and low enough that walking the tree, aliases expanded, stays cheap.
struct Limits {
  size_t max_nodes = 50000;            // nodes written in the text
  size_t max_expanded_nodes = 100000;  // nodes seen when every alias is expanded
  int max_depth = 64;                  // nested collections
};

class Document;

// A handle on one node of a Document; cheap to copy. An alias is resolved transparently
// (its kind, tag, value and children are its anchor's), but keeps its own Mark so a
// problem found through it is reported where the alias is used.
class Node {
 public:
  enum class Kind : uint8_t { kNull, kScalar, kSequence, kMap };

  Node() = default;  // a null node with no position (an empty document)

  Kind kind() const;
  bool IsNull() const { return kind() == Kind::kNull; }
  bool IsScalar() const { return kind() == Kind::kScalar; }
  bool IsSequence() const { return kind() == Kind::kSequence; }
  bool IsMap() const { return kind() == Kind::kMap; }
  // yaml-cpp's tag: "?" for a plain scalar, "!" for a quoted one, else the resolved tag
  // ("tag:yaml.org,2002:str", "!custom").
  const std::string& Tag() const;
  const std::string& Scalar() const;  // empty unless a scalar
  Mark GetMark() const;
  bool IsFlow() const;  // a collection written in flow style ([...] / {...})
  bool IsAlias() const;

  size_t size() const;              // entries of a sequence, pairs of a map, else 0
  Node operator[](size_t i) const;  // sequence entry i
  Node key(size_t i) const;         // key of map pair i
  Node value(size_t i) const;       // value of map pair i

 private:
  friend class Document;
  Node(const Document* doc, uint32_t id) : doc_(doc), id_(id) {}
  uint32_t target() const;  // id_ with an alias resolved
  const Document* doc_ = nullptr;
  uint32_t id_ = 0;
};

class Document {
 public:
  Node root() const { return root_ < nodes_.size() ? Node(this, root_) : Node(); }

 private:
  friend class Node;
  friend class Builder;
  struct Data {
    Node::Kind kind = Node::Kind::kNull;
    bool flow = false;
    bool alias = false;
    uint32_t target = 0;  // for an alias: the anchored node
    Mark mark;
    std::string tag;
    std::string scalar;
    std::vector<uint32_t> children;  // a map's are key, value, key, value, ...
  };
  std::vector<Data> nodes_;
  uint32_t root_ = UINT32_MAX;
};

struct Loaded {
  Document document;
  bool empty = true;  // no document at all (empty text, only comments)
  // Set when the text holds more than one document; where the second one starts.
  bool second_document = false;
  Mark second_document_mark;
  std::vector<LoadError> errors;  // when not empty, `document` is not to be used
};

// Reads the text: the prescan, then the first document through yaml-cpp's event parser.
// Never throws; every problem is in `errors` with its position.
Loaded load(std::string_view text, const Limits& limits = Limits{});

// The prescan alone: bytes a manifest must not contain, and flow brackets nested deeper
// than yaml-cpp should be asked to scan. Appends to `errors`; false when any was found.
bool prescan(std::string_view text, std::vector<LoadError>& errors);

// Given text[pos] is a quote (' or "), the offset of the quote that ends that quoted scalar
// (YAML's rules: '' inside single quotes, backslash escapes inside double quotes); npos
// when the text ends first.
size_t quoted_end(std::string_view text, size_t pos);

// The offset of the first byte in `s` that is not printable UTF-8: NUL and other C0/C1
// controls, DEL, invalid UTF-8; tab and line feed count as printable when `text` is set.
// npos when there is none.
size_t find_unprintable(std::string_view s, bool text);

}  // namespace kreg::manifest_yaml
