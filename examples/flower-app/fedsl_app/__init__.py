"""fedsl on Flower: the example app (ServerApp + ClientApp from ``fedsl.flower``)."""
