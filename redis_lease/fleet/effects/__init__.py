"""Effects under the fence: the effect ledger and reconciliation (:mod:`.ledger`), and the
fleet-wide cap on calls to one provider (:mod:`.provider_gate`)."""
