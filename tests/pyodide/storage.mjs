// A Durable Object's ctx.storage on node:sqlite, for the agent object under Pyodide: the rules
// of durable_turns.cloudflare.testing's fake (which the CPython tests hold it to), kept here
// in JavaScript, where Pyodide's values cross as they do on workerd.
//
// - sql.exec(query, ...bindings) runs at once; its cursor has raw().toArray(), toArray(),
//   one(), columnNames, rowsRead, rowsWritten;
// - a write outside an explicit transaction joins an implicit transaction that commits at
//   the next turn of the event loop (setTimeout 0: where Pyodide's call_soon runs too), so a
//   SIGKILL before then loses it;
// - transactionSync(fn): a savepoint, undone if fn throws; transaction(async fn): the same
//   across awaits (no implicit commit meanwhile), undone by a throw or txn.rollback();
// - refused: SQL transaction control, PRAGMA user_version, names starting _cf_, more than
//   100 bindings, undefined as a binding, a value over 4 MiB (workerd's, as SQLite's
//   "string or blob too big");
// - one alarm, kept in the database (setAlarm, getAlarm, deleteAlarm).
import { DatabaseSync } from "node:sqlite";

const CONTROL = /^\s*(BEGIN|COMMIT|END|ROLLBACK|SAVEPOINT|RELEASE)\b/i;
const REFUSED = [/\bPRAGMA\s+user_version\b/i, /\b_cf_/i, /\bATTACH\b/i, /\bTEMP(ORARY)?\s+TABLE\b/i];

const VALUE_BYTES = 4 * 1024 * 1024;

export class Storage {
  constructor(path) {
    this.db = new DatabaseSync(path);
    this.depth = 0;
    this.awaiting = 0;
    this.implicit = false;
    this.db.exec("CREATE TABLE IF NOT EXISTS _cf_alarm (at REAL NOT NULL)");
    this.sql = { exec: (query, ...bindings) => this.run(query, bindings) };
  }

  join() {
    if (this.implicit) return;
    this.db.exec("BEGIN");
    this.implicit = true;
    setTimeout(() => this.commitImplicit(), 0);
  }

  commitImplicit() {
    if (!this.implicit || this.awaiting) return;
    this.implicit = false;
    this.db.exec("COMMIT");
  }

  run(query, bindings) {
    if (CONTROL.test(query)) {
      throw new Error("To execute a transaction, please use the state.storage.transaction() " +
                      "or state.storage.transactionSync() APIs instead of the SQL BEGIN " +
                      "TRANSACTION or SAVEPOINT statements.");
    }
    for (const refused of REFUSED) {
      if (refused.test(query)) throw new Error(`not authorized: ${query.slice(0, 60)}`);
    }
    if (bindings.length > 100) throw new Error("too many SQL variables");
    if (bindings.some((b) => b === undefined)) throw new Error("Wrong type: undefined");
    if (bindings.some((b) => typeof b === "string" && Buffer.byteLength(b) > VALUE_BYTES)) {
      throw new Error("string or blob too big: SQLITE_TOOBIG");
    }
    this.join();
    const before = this.db.prepare("SELECT total_changes() AS n").get().n;
    const statement = this.db.prepare(query);
    statement.setReturnArrays(true);
    const rows = statement.all(...bindings);
    const columns = statement.columns().map((c) => c.name);
    const written = this.db.prepare("SELECT total_changes() AS n").get().n - before;
    return {
      columnNames: columns,
      rowsRead: rows.length,
      rowsWritten: written,
      raw: () => ({ toArray: () => rows.map((r) => [...r]) }),
      toArray: () => rows.map((r) => Object.fromEntries(columns.map((c, i) => [c, r[i]]))),
      one() {
        if (rows.length !== 1) {
          throw new Error(`Expected exactly one result from SQL query, but got ${rows.length}.`);
        }
        return this.toArray()[0];
      },
    };
  }

  open() {
    this.join();
    this.depth += 1;
    const name = `_cf_savepoint_${this.depth}`;
    this.db.exec(`SAVEPOINT ${name}`);
    return name;
  }

  close(name, undo) {
    this.depth -= 1;
    if (undo) this.db.exec(`ROLLBACK TO ${name}`);
    this.db.exec(`RELEASE ${name}`);
  }

  reschedule() {
    if (this.implicit && !this.awaiting) setTimeout(() => this.commitImplicit(), 0);
  }

  transactionSync(fn) {
    const name = this.open();
    let out;
    try {
      out = fn();
    } catch (e) {
      this.close(name, true);
      throw e;
    }
    this.close(name, false);
    return out;
  }

  async transaction(fn) {
    const name = this.open();
    this.awaiting += 1;
    const txn = { rolledBack: false, rollback() { this.rolledBack = true; } };
    let out;
    try {
      out = await fn(txn);
    } catch (e) {
      this.awaiting -= 1;
      this.close(name, true);
      this.reschedule();
      throw e;
    }
    this.awaiting -= 1;
    this.close(name, txn.rolledBack);
    this.reschedule();
    return out;
  }

  async getAlarm() {
    const row = this.db.prepare("SELECT at FROM _cf_alarm").get();
    return row === undefined ? null : row.at;
  }

  async setAlarm(at) {
    this.db.prepare("DELETE FROM _cf_alarm").run();
    this.db.prepare("INSERT INTO _cf_alarm (at) VALUES (?)").run(Number(at));
  }

  async deleteAlarm() {
    this.db.prepare("DELETE FROM _cf_alarm").run();
  }
}
