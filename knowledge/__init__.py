"""The shipped knowledge base: entries/<id>.yaml, schema.json and the benign corpus (data only)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent
ENTRIES = ROOT / "entries"
BENIGN = ROOT / "benign"
SCHEMA = ROOT / "schema.json"
XIDS = ROOT / "xids.yaml"
XIDS_SCHEMA = ROOT / "xids.schema.json"
