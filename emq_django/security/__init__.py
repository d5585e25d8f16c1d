"""CURVE encryption and who may use which port (issue 16).

- ``keys``: this process's key pair and the broker's public key, from the settings;
- ``zap``: the broker's ZAP handler, which admits a client key only on the ports
  its roles allow, from an allow-list held in memory;
- ``roles``: the roles and which commands each one may send;
- ``models``/``admin``: the allow-list in Django (``AuthorizedKey``), managed with
  the admin or ``manage.py emq_keys``.

Add ``"emq_django.security"`` to ``INSTALLED_APPS`` for the model; the transport
part (``keys``) works without it.
"""
