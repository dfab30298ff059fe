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


def _copy_each_table_once():
    """Make moto's TransactWriteItems back up each table once, not once per item.

    moto deep-copies the whole table for every item of a transaction (its
    rollback backup), so a 100-item transaction on a 1,000-row table copies
    100,000 items and takes seconds: time real DynamoDB never spends, which
    made grouped writes look slower on the emulator than one write per row.
    The copies of one transaction are identical (nothing changes in between:
    DynamoDB requests are serialized above), so copying a table once per
    transaction keeps moto's behaviour and rollback exactly.
    """
    import copy as _copy

    import moto.dynamodb.models as models

    original = models.DynamoDBBackend.transact_write_items

    class _OncePerTable:
        def __init__(self):
            self.tables = {}

        def deepcopy(self, obj, *args, **kwargs):
            if isinstance(obj, models.Table):
                if id(obj) not in self.tables:
                    self.tables[id(obj)] = _copy.deepcopy(obj, *args, **kwargs)
                return self.tables[id(obj)]
            return _copy.deepcopy(obj, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(_copy, name)

    def transact_write_items(self, transact_items):
        models.copy = _OncePerTable()
        try:
            return original(self, transact_items)
        finally:
            models.copy = _copy

    models.DynamoDBBackend.transact_write_items = transact_write_items


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=5000)
    args = parser.parse_args()
    os.environ.setdefault("MOTO_PORT", str(args.port))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    _copy_each_table_once()
    app = DomainDispatcherApplication(create_backend_app)
    app.debug = True
    run_simple(args.host, args.port, SerializeDynamoDB(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
