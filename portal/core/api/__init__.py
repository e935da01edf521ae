"""The REST API under ``/api/`` (serializers declare and validate, viewsets translate, services do the work)."""
