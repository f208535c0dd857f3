"""The write path's statements, run by the database driver itself.

A :class:`Direct` wraps one SQLAlchemy Core statement of :mod:`app.store.statements`, written
once for both engines. It is compiled once per dialect and set of parameter names into
its SQL text, its parameters' order and their types' bind processors, and then run on a
cursor of the connection's DBAPI connection (the stdlib ``sqlite3`` one; SQLAlchemy's
adaptation of asyncpg, inside the greenlet of ``run_sync``), in the transaction
SQLAlchemy began and commits as before.

Why: a stored response's record is three to five statements, and SQLAlchemy's execution
path around each (an execution context, events, parameter processing, a result object)
costs several times what SQLite itself spends on it. On SQLite that CPU is spent by the
writer thread (:mod:`app.store.sqlite_writer`), which shares the GIL with the event
loop; on PostgreSQL the statements run on the event loop itself (in ``run_sync``'s
greenlet). Either way it is taken from requests.

The contract kept: the SQL is SQLAlchemy's own compilation of the statement, the
values go through each column type's own bind processor (JSON columns keep their text
exactly), a driver's error is raised as SQLAlchemy raises it (an integrity error as
``IntegrityError``, a lost connection as ``OperationalError`` or ``InterfaceError``), and
the statement runs in the caller's transaction. What is not kept: SQLAlchemy's
statement events (``before_cursor_execute``) do not see these statements.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.sql.expression import Executable

Params = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    names: tuple[str, ...]
    processors: tuple[Callable[[Any], Any] | None, ...]

    def values(self, params: Params) -> tuple[Any, ...]:
        return tuple(
            params[name] if process is None else process(params[name])
            for name, process in zip(self.names, self.processors, strict=True)
        )


class Direct:
    """One statement of the write path (see the module's contract)."""

    def __init__(self, statement: Executable) -> None:
        self.statement = statement
        self._compiled: dict[tuple[str, tuple[str, ...]], _Compiled] = {}

    def execute(self, connection: Connection, params: Params | Sequence[Params]) -> int:
        """Run with one set of parameters or several (one row each); the rows an UPDATE
        matched or a single INSERT wrote (several rows: the driver may not count)."""
        many = not isinstance(params, Mapping)
        rows: Sequence[Params] = params if many else [params]  # type: ignore[assignment,list-item]
        if not rows:
            return 0
        compiled = self._compile(connection.dialect, tuple(rows[0]))
        cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            if many:
                cursor.executemany(compiled.sql, [compiled.values(row) for row in rows])
            else:
                cursor.execute(compiled.sql, compiled.values(rows[0]))
        except connection.dialect.loaded_dbapi.Error as error:
            raise _as_sqlalchemy(compiled.sql, error, connection.dialect) from error
        finally:
            count = cursor.rowcount
            cursor.close()
        return count  # type: ignore[no-any-return]

    def first(self, connection: Connection, params: Params) -> tuple[Any, ...] | None:
        """The first row of a query (or of a data-modifying ``WITH`` query's answer), as a
        tuple (its columns must need no result processing: text and numbers)."""
        compiled = self._compile(connection.dialect, tuple(params))
        cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(compiled.sql, compiled.values(params))
            row = cursor.fetchone()
        except connection.dialect.loaded_dbapi.Error as error:
            raise _as_sqlalchemy(compiled.sql, error, connection.dialect) from error
        finally:
            cursor.close()
        return None if row is None else tuple(row)

    def _compile(self, dialect: Dialect, names: tuple[str, ...]) -> _Compiled:
        key = (f"{dialect.name}+{dialect.driver}", names)
        compiled = self._compiled.get(key)
        if compiled is None:
            sql = self.statement.compile(dialect=dialect, column_keys=list(names))  # type: ignore[attr-defined]
            order = tuple(sql.positiontup or ())
            compiled = self._compiled[key] = _Compiled(
                sql.string, order, tuple(sql.binds[name].type.bind_processor(dialect) for name in order)
            )
        return compiled


def _as_sqlalchemy(sql: str, error: Exception, dialect: Dialect) -> StatementError:
    """The driver's error as SQLAlchemy raises it for its own statements: an
    :class:`IntegrityError` for a constraint, an ``OperationalError`` or
    ``InterfaceError`` for a connection that failed, and so on."""
    return DBAPIError.instance(sql, None, error, dialect.loaded_dbapi.Error)
