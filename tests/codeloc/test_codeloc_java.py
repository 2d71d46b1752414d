"""A Java service's checkout: Spring and JAX-RS routes to their methods, JDBC SQL strings to the methods that hold
them (what the OpenTelemetry Java agent records: the statement with ``?``, no ``code.*``)."""

from __future__ import annotations

from pathlib import Path

from processors.codeloc import Site
from tests.codeloc.sample import checkout, client, line_of, locator, server, trace

CONTROLLER = "src/main/java/com/shop/accounts/AccountController.java"
SPRING = {
    CONTROLLER: '''
        package com.shop.accounts;

        import org.springframework.web.bind.annotation.*;

        /* a comment with a { brace and "a string" */
        @RestController
        @RequestMapping("/accounts")
        public class AccountController {
            private static final String READ = "SELECT balance FROM accounts " + "WHERE id = ?";
            private final JdbcTemplate jdbc;

            public AccountController(JdbcTemplate jdbc) { this.jdbc = jdbc; }

            @PostMapping("/{id}/withdraw")
            @Transactional
            public Map<String, Object> withdraw(@PathVariable long id, @RequestParam int amount) throws SQLException {
                int balance = jdbc.queryForObject(READ, Integer.class, id);
                jdbc.update("UPDATE accounts SET balance = ? " +
                            "WHERE id = ?", balance - amount, id);  // "}" in a comment
                return Map.of("balance", balance - amount);
            }

            @RequestMapping(value = "/{id}", method = RequestMethod.GET)
            public Account show(@PathVariable long id) {
                Runnable audit = () -> { log("shown"); };
                return jdbc.query("""
                    SELECT * FROM accounts
                    WHERE id = ?
                    """, id);
            }
        }
    ''',
    "src/main/java/com/shop/jobs/Interest.java": """
        package com.shop.jobs;

        @Path("/interest")
        public class Interest {
            @POST
            @Path("/apply")
            public void apply() {
                jdbc.update("UPDATE accounts SET balance = balance * 1.01 WHERE balance > ?", 0);
            }
        }
    """,
}


def _site(root: Path, method: str, route: str, statement: str) -> Site | None:
    t = trace(server(1, method, route, service="accounts"), client(2, 1, statement, service="accounts"))
    return locator(root).sites(t, [t.spans[1]]).get(t.spans[1].span_id)


def test_spring_mappings_name_the_controller_method_and_the_line_of_its_statement(tmp_path: Path) -> None:
    """Class ``@RequestMapping`` prefix + ``@PostMapping``; ``@RequestMapping(method = RequestMethod.GET)``."""
    root = checkout(tmp_path, SPRING)
    file = str(root / CONTROLLER)
    update = "UPDATE accounts SET balance = ? WHERE id = ?"
    assert _site(root, "POST", "/accounts/{id}/withdraw", update) == Site(
        "com.shop.accounts.AccountController.withdraw", file, line_of(root, CONTROLLER, 'jdbc.update("UPDATE'), "route"
    )
    show = _site(root, "GET", "/accounts/{id}", "SELECT * FROM accounts WHERE id = ?")
    assert show == Site("com.shop.accounts.AccountController.show", file, line_of(root, CONTROLLER, "jdbc.query("),
                        "route")  # fmt: skip


def test_jaxrs_paths_and_a_statement_without_a_route(tmp_path: Path) -> None:
    """``@Path`` on the class and the method with ``@POST``; a request of no known route is found by its SQL (a
    class constant joined with ``+`` included)."""
    root = checkout(tmp_path, SPRING)
    interest = "src/main/java/com/shop/jobs/Interest.java"
    apply = _site(root, "POST", "/interest/apply", "UPDATE accounts SET balance = balance * 1.01 WHERE balance > ?")
    assert apply == Site("com.shop.jobs.Interest.apply", str(root / interest), line_of(root, interest, "jdbc.update"),
                         "route")  # fmt: skip
    read = _site(root, "POST", "/unknown", "SELECT balance FROM accounts WHERE id = ?")
    assert read == Site("com.shop.accounts.AccountController.withdraw", str(root / CONTROLLER),
                        line_of(root, CONTROLLER, "queryForObject(READ"), "statement")  # fmt: skip
