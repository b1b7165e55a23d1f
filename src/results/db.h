// SQLite plumbing for the results store: RAII handles, parameter binding, and the one place where
// the schema is created and checked. Internal to src/results; nothing outside includes it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

struct sqlite3;
struct sqlite3_stmt;

namespace ab::results::detail {

// PRAGMA application_id of our databases: "ABNC". Tells our file apart from any other SQLite db.
constexpr std::int32_t kApplicationId = 0x41424E43;

class Db {
 public:
  enum class Mode {
    create,    // create the file and schema if missing; the connection must be writable
    existing,  // the file must exist and be ours; only read
  };
  // Opens and checks the database; every error names the path and SQLite's (and the OS's) reason.
  Db(std::filesystem::path path, Mode mode);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  void exec(const char* sql);  // fixed SQL only: data always goes through Stmt::bind_*
  const std::filesystem::path& path() const { return path_; }
  sqlite3* handle() const { return db_; }
  // Throws ab::Error "<path>: <what>: <sqlite reason>"; a file that is not a database gets the
  // "is not an accelbench results database" wording.
  [[noreturn]] void fail(const std::string& what, int rc) const;

 private:
  void check_schema(Mode mode);
  sqlite3* db_ = nullptr;
  std::filesystem::path path_;
};

class Stmt {
 public:
  Stmt(Db& db, const char* sql);
  ~Stmt();
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  // Parameters are 1-based, as in SQLite.
  Stmt& bind_text(int index, const std::string& value);
  Stmt& bind_int(int index, std::int64_t value);
  Stmt& bind_null(int index);
  bool step();  // true: a row is ready; false: done
  std::string text(int col) const;  // "" for NULL
  std::int64_t int64(int col) const;
  bool is_null(int col) const;

 private:
  Db& db_;
  sqlite3_stmt* stmt_ = nullptr;
  std::string sql_;
};

// The view results_<workload> (a '-' in the name becomes '_'): every point of the workload with one
// column per axis it has ever had, then status, times, rate, unit and % of ceiling. Re-created
// when a point brings an axis the view lacks; names that are not [A-Za-z0-9_] get no view or column.
// The caller holds the transaction.
void ensure_workload_view(Db& db, const std::string& workload, const std::vector<std::string>& axes_of_point);

// BEGIN IMMEDIATE takes the write lock up front: two writers that both began deferred could each
// hold a read lock and wait on the other, and SQLite would fail one without using the busy timeout.
class Transaction {
 public:
  explicit Transaction(Db& db);
  ~Transaction();  // rolls back unless committed; never throws
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();

 private:
  Db& db_;
  bool open_ = true;
};

}  // namespace ab::results::detail
