"""Operations on the data model: each takes ids or instances, validates, runs in a transaction, audits."""
