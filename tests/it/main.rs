mod audit;
mod docker;
mod fuzz;
mod run;
mod script;
mod ssh;
mod support;
