"""Inference endpoints given as a DNS name, resolved and refreshed (docs/operations-promotion.md).

- `entries`: parsing `dns+http://NAME:PORT/PATH` entries (the settings validate with it);
- `lookup`: one A/AAAA lookup through dnspython (resolv.conf, or explicit nameservers);
- `directory`: the last known addresses and each policy's endpoints from them, shared by the
  gateway (a refresh worker) and the promotion job (`current_endpoints`).

Nothing is imported here: the settings import `entries`, and `directory` imports the settings.
"""
