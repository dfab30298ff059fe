"""moto server with DynamoDB requests serialized.

moto's server is threaded, and its DynamoDB backend checks a
ConditionExpression and applies the update as two steps without a lock, so
two concurrent conditional writes can both pass: "exactly one worker claims
the batch" fails now and then on the emulator although real DynamoDB makes
each conditional write atomic. This wrapper runs moto's own WSGI app and
takes one lock around every DynamoDB request (X-Amz-Target DynamoDB_*), which
restores that atomicity. Other services stay concurrent, so SQS long polls do
not block anything.

Usage: moto_server_serialized.py -H 127.0.0.1 -p PORT (as moto_server).
"""

import argparse
import os
import signal
import sys
import threading

from werkzeug.serving import run_simple

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)

_dynamodb = threading.Lock()


class SerializeDynamoDB:
    """WSGI middleware: one DynamoDB request at a time, everything else as is."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB_"):
            with _dynamodb:
                # Drain the response inside the lock: the backend's work may
                # be lazy.
                return list(self.app(environ, start_response))
        return self.app(environ, start_response)


def _back_up_only_the_items_a_transaction_writes():
    """Make moto's TransactWriteItems back up the items it writes, not whole tables.

    moto deep-copies the whole table for every item of a transaction (its
    rollback backup), so a 100-item transaction on a 1,000-row table copied
    100,000 items and took seconds: time real DynamoDB never spends, which
    made grouped writes look slower on the emulator than one write per row.
    Copying each table once per transaction still cost the emulator stage
    most of its time (a quarter of moto's CPU in the whole-stack tests, by
    py-spy). A transaction writes at most 100 items, each named by its key,
    so those items alone are copied beforehand (None for an absent one) and
    put back, in reverse, when the transaction fails; so is the table's
    stream, cut back to its length before. The table object itself is
    handed to moto as its own "backup", which makes moto's rollback (putting
    the backup in the table's place) a no-op. DynamoDB requests are
    serialized above, so nothing else writes in between.
    """
    import copy as _copy

    import moto.dynamodb.models as models
    from moto.dynamodb.models.dynamo_type import DynamoType

    original = models.DynamoDBBackend.transact_write_items

    class _TablesAsTheirOwnBackup:
        def deepcopy(self, obj, *args, **kwargs):
            if isinstance(obj, models.Table):
                return obj
            return _copy.deepcopy(obj, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(_copy, name)

    def written_key(table, op_type, op):
        attrs = op.get("Item") if op_type == "Put" else op.get("Key")
        if not isinstance(attrs, dict) or table.hash_key_attr not in attrs:
            return None
        range_key = None
        if table.range_key_attr is not None:
            if table.range_key_attr not in attrs:
                return None
            range_key = DynamoType(attrs[table.range_key_attr])
        return DynamoType(attrs[table.hash_key_attr]), range_key

    def back_up(self, transact_items):
        saved, streams = [], {}
        for entry in transact_items:
            if not isinstance(entry, dict) or len(entry) != 1:
                continue
            op_type, op = next(iter(entry.items()))
            table = self.tables.get(op.get("TableName")) if isinstance(op, dict) else None
            if table is None:
                continue
            key = written_key(table, op_type, op)
            if key is None:
                continue
            try:
                current = table.get_item(*key)
            except Exception:  # an invalid key: moto rejects it before writing
                continue
            saved.append((table, key, _copy.deepcopy(current)))
            if table.stream_shard is not None:
                streams.setdefault(id(table), (table.stream_shard, len(table.stream_shard.items)))
        return saved, streams

    def put_back(saved, streams):
        for table, (hash_key, range_key), item in reversed(saved):
            if range_key is not None:
                if item is None:
                    table.items.get(hash_key, {}).pop(range_key, None)
                else:
                    table.items[hash_key][range_key] = item
            elif item is None:
                table.items.pop(hash_key, None)
            else:
                table.items[hash_key] = item
        for shard, length in streams.values():
            del shard.items[length:]

    def transact_write_items(self, transact_items):
        saved, streams = back_up(self, transact_items)
        models.copy = _TablesAsTheirOwnBackup()
        try:
            return original(self, transact_items)
        except BaseException:
            put_back(saved, streams)
            raise
        finally:
            models.copy = _copy

    models.DynamoDBBackend.transact_write_items = transact_write_items


def _cut_per_request_overhead():
    """Drop two costs moto's server pays on every request, for nothing here.

    py-spy on a test of 2,000 small updates found a fifth of moto's CPU
    outside DynamoDB: werkzeug's access log line (written to moto.log, read
    by nobody; warnings and errors are still logged) and the dispatcher's
    listing of moto's own package directory, once per request, to see
    whether the Host header names a service. The installed modules do not
    change while the server runs, so that list is read once.
    """
    import logging

    import moto.backends as backends

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules


def _parse_each_update_expression_once():
    """Parse each UpdateExpression once, and copy its tree cheaply.

    py-spy on the whole-stack tests (after the cuts above) found a tenth of
    moto's CPU parsing UpdateExpressions, although this project sends a few
    dozen distinct ones (the values change, the expression does not), and
    another few percent in the validator's deepcopy of the parsed tree.
    moto never changes a parsed tree: its validator works on its own copy,
    the request checks only read it. So the parse is cached by the
    expression's text (a failed parse raises each time, as before), and the
    validator's copy of a tree goes through pickle, a third of deepcopy's
    time for these plain objects (anything else still goes to deepcopy).
    """
    import copy as _copy
    import functools
    import pickle

    from moto.dynamodb.parsing import expressions, validators
    from moto.dynamodb.parsing.ast_nodes import Node

    expressions.UpdateExpressionParser.make = staticmethod(
        functools.lru_cache(maxsize=4096)(expressions.UpdateExpressionParser.make)
    )

    def copy_tree(obj, *args, **kwargs):
        if isinstance(obj, Node) and not args and not kwargs:
            try:
                return pickle.loads(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
            except Exception:  # not picklable after all: the slow way
                pass
        return _copy.deepcopy(obj, *args, **kwargs)

    validators.deepcopy = copy_tree


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=5000)
    args = parser.parse_args()
    os.environ.setdefault("MOTO_PORT", str(args.port))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    _back_up_only_the_items_a_transaction_writes()
    _cut_per_request_overhead()
    _parse_each_update_expression_once()
    app = DomainDispatcherApplication(create_backend_app)
    app.debug = True
    run_simple(args.host, args.port, SerializeDynamoDB(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
